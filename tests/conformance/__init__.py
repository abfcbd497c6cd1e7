"""The conformance suite: the behaviour every backend must show."""
