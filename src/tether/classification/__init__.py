"""Classification: busy, or no such number? One verdict for any failure shape (pure,
no I/O). The public names are in :mod:`tether`."""
