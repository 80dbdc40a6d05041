"""Connector pipelines between env and module (pure functions)."""

from jaxrunner.connectors.actions import make_actions_for_env as make_actions_for_env

__all__ = ["make_actions_for_env"]
