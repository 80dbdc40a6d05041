"""Episode containers: the device batches `sample()` returns and their host views
(`SingleAgentEpisode`, `MultiAgentEpisode`), convertible to `ray.rllib` episodes."""

from jaxrunner.episodes.batch import EpisodeBatch as EpisodeBatch
from jaxrunner.episodes.multi_agent_episode import MultiAgentEpisode as MultiAgentEpisode
from jaxrunner.episodes.multi_agent_episode import (
    MultiAgentEpisodeBatch as MultiAgentEpisodeBatch)
from jaxrunner.episodes.single_agent_episode import SingleAgentEpisode as SingleAgentEpisode

__all__ = ["EpisodeBatch", "MultiAgentEpisode", "MultiAgentEpisodeBatch", "SingleAgentEpisode"]
