"""`TicTacToe`: a turn-based two-player game (RLlib's tic-tac-toe example env, in JAX).

* Agents: `"player_x"` (moves first) and `"player_o"`; exactly one acts per step.
* Observation (per agent): `(9,)` float32 board from that player's side: +1 own mark,
  -1 opponent's mark, 0 empty (row-major cells 0..8). Both players get one at every step;
  only the player to move acts on it.
* Action: Discrete(9), the cell to mark.
* Rewards (given to both players in the final step): +1 to the winner and -1 to the
  loser; 0 each for a draw. Marking an occupied cell loses the game at once. A player
  receives the final reward also when the opponent moved last; the runner adds it to
  that player's last move.
* Termination: a line of three, a full board, or an illegal move; `"__all__"` and both
  agents are terminated together. Episodes last at most 9 steps; there is no truncation.

Reset is deterministic (empty board, X to move), so an episode depends only on the
actions taken.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from jaxrunner.envs.multi_agent import ALL, MultiAgentEnv

_LINES = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8],
                   [0, 4, 8], [2, 4, 6]], np.int32)


@struct.dataclass
class TicTacToeState:
    board: jax.Array  # (9,) int32: +1 X, -1 O, 0 empty
    to_move: jax.Array  # () int32: 0 = player_x, 1 = player_o
    time: jax.Array  # () int32


class TicTacToe(MultiAgentEnv):
    """Two players mark a 3x3 board in turns."""

    agents = ("player_x", "player_o")

    @property
    def name(self) -> str:
        return "TicTacToe-v0"

    def observation_space(self, agent_id: str, params: Any = None):
        return spaces.Box(-1.0, 1.0, (9,), jnp.float32)

    def action_space(self, agent_id: str, params: Any = None):
        return spaces.Discrete(9)

    def _obs(self, board: jax.Array) -> dict:
        board = board.astype(jnp.float32)
        return {"player_x": board, "player_o": -board}

    def reset_env(self, key, params):
        del key, params
        board = jnp.zeros((9,), jnp.int32)
        state = TicTacToeState(board=board, to_move=jnp.zeros((), jnp.int32),
                               time=jnp.zeros((), jnp.int32))
        return self._obs(board), state

    def step_env(self, key, state, actions, params):
        del key, params
        x_moves = state.to_move == 0
        cell = jnp.where(x_moves, actions["player_x"], actions["player_o"]).astype(jnp.int32)
        mark = jnp.where(x_moves, 1, -1).astype(jnp.int32)
        legal = state.board[cell] == 0
        board = jnp.where(legal, state.board.at[cell].set(mark), state.board)
        lines = board[_LINES]  # (8, 3)
        won = legal & jnp.any(jnp.all(lines == mark, axis=1))
        full = jnp.all(board != 0)
        over = ~legal | won | full
        # Reward of the player who moved: +1 win, -1 illegal move; the other gets minus it.
        mover_reward = jnp.where(won, 1.0, jnp.where(legal, 0.0, -1.0)).astype(jnp.float32)
        x_reward = jnp.where(x_moves, mover_reward, -mover_reward)
        rewards = {"player_x": x_reward, "player_o": -x_reward}
        terminateds = {"player_x": over, "player_o": over, ALL: over}
        false = jnp.zeros((), jnp.bool_)
        truncateds = {"player_x": false, "player_o": false, ALL: false}
        new_state = TicTacToeState(board=board, to_move=1 - state.to_move,
                                   time=state.time + 1)
        return self._obs(board), new_state, rewards, terminateds, truncateds, {}

    def agents_to_act(self, state, params):
        return {"player_x": state.to_move == 0, "player_o": state.to_move == 1}
