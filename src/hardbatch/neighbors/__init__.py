"""hardbatch.neighbors."""
