"""``balance`` — opendrs's own rebalancing strategy, as a package (see :mod:`.strategy`)."""
