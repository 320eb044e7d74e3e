"""Every state each kind of object can be in, and the tables saying how it may move."""
