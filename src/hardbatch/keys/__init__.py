"""hardbatch.keys."""
