"""A plugin module that fails to import (a deployment problem, surfaced on first use)."""

raise ImportError("the plugin's own dependency is missing")
