"""The acceptance-source kinds, one module each (registered in :mod:`dsparksim.acceptance`)."""
