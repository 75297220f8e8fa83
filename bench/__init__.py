"""opendrs benchmarks: ``make bench`` (``python -m bench``)."""
