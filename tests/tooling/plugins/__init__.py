"""Parts added from outside the package, as a plugin would: one file each (``test_plugins.py`` runs them)."""
