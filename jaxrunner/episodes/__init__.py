"""Episode containers: the device `EpisodeBatch` and host `SingleAgentEpisode` views."""

from jaxrunner.episodes.batch import EpisodeBatch as EpisodeBatch
from jaxrunner.episodes.single_agent_episode import SingleAgentEpisode as SingleAgentEpisode

__all__ = ["EpisodeBatch", "SingleAgentEpisode"]
