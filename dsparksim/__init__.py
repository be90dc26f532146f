"""dsparksim: a discrete-event serving simulator for speculative decoding with confidence-scheduled verification.

The simulator core (this package minus ``dsparksim.backend``) never imports torch.
"""
__version__ = "0.1.0"
