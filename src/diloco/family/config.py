"""``FamilyConfig``, re-exported from ``diloco.config_sections`` (where ``DiLoCoConfig.family`` finds it)."""

from diloco.config_sections import PATTERNS, FamilyConfig

__all__ = ["FamilyConfig", "PATTERNS"]
