"""Connector pipelines between env and module: pure pieces with state in the carry."""

from jaxrunner.connectors.actions import make_actions_for_env as make_actions_for_env
from jaxrunner.connectors.base import ConnectorContext as ConnectorContext
from jaxrunner.connectors.base import ConnectorPipeline as ConnectorPipeline
from jaxrunner.connectors.base import ConnectorV2 as ConnectorV2
from jaxrunner.connectors.env_to_module import FlattenObservations as FlattenObservations
from jaxrunner.connectors.env_to_module import FrameStacking as FrameStacking
from jaxrunner.connectors.env_to_module import MeanStdFilter as MeanStdFilter
from jaxrunner.connectors.env_to_module import PrevActionsPrevRewards as PrevActionsPrevRewards
from jaxrunner.connectors.module_to_env import NormalizeAndClipActions as NormalizeAndClipActions
from jaxrunner.connectors.multi_agent import (
    MultiAgentConnectorPipeline as MultiAgentConnectorPipeline)

__all__ = ["ConnectorContext", "ConnectorPipeline", "ConnectorV2", "FlattenObservations",
           "FrameStacking", "MeanStdFilter", "MultiAgentConnectorPipeline",
           "NormalizeAndClipActions", "PrevActionsPrevRewards", "make_actions_for_env"]
