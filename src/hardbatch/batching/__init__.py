"""hardbatch.batching."""
