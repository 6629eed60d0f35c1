"""Importing this module registers Lion and random-k: what ``--plugin plugins.enable`` loads in every MPI rank."""

from . import register

register()
