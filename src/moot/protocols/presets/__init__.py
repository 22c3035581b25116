"""The debate formats of the seeds and the literature, each a short spec on the one engine.

Every factory takes its few parameters (rounds, agents, ...) and returns a fresh
:class:`~moot.core.spec.ProtocolSpec`; ``moot protocols show NAME`` prints it as YAML.
"""

from __future__ import annotations

from moot.protocols.presets.baselines import DIRECT_OPENING as DIRECT_OPENING
from moot.protocols.presets.baselines import direct as direct
from moot.protocols.presets.baselines import select as select
from moot.protocols.presets.baselines import single as single
from moot.protocols.presets.baselines import usc as usc
from moot.protocols.presets.baselines import vote as vote
from moot.protocols.presets.beyond_vote import ANTI_CONFORMITY_REBUTTAL as ANTI_CONFORMITY_REBUTTAL
from moot.protocols.presets.beyond_vote import FREE_MAD_WEIGHTS as FREE_MAD_WEIGHTS
from moot.protocols.presets.beyond_vote import adaptive_debate as adaptive_debate
from moot.protocols.presets.beyond_vote import cisc as cisc
from moot.protocols.presets.beyond_vote import free_mad as free_mad
from moot.protocols.presets.beyond_vote import mad_conformist as mad_conformist
from moot.protocols.presets.literature import BRIEF_TOGETHER as BRIEF_TOGETHER
from moot.protocols.presets.literature import CHATEVAL_FOLLOWUP as CHATEVAL_FOLLOWUP
from moot.protocols.presets.literature import CHATEVAL_JOINING as CHATEVAL_JOINING
from moot.protocols.presets.literature import CHATEVAL_OPENING as CHATEVAL_OPENING
from moot.protocols.presets.literature import CHATEVAL_PERSONAS as CHATEVAL_PERSONAS
from moot.protocols.presets.literature import DU_REBUTTAL as DU_REBUTTAL
from moot.protocols.presets.literature import MAD_DEBATER as MAD_DEBATER
from moot.protocols.presets.literature import Decide as Decide
from moot.protocols.presets.literature import Exchange as Exchange
from moot.protocols.presets.literature import History as History
from moot.protocols.presets.literature import chateval as chateval
from moot.protocols.presets.literature import mad as mad
from moot.protocols.presets.literature import society_of_minds as society_of_minds
from moot.protocols.presets.report_rules import Signal as Signal
from moot.protocols.presets.report_rules import adaptive_consistency as adaptive_consistency
from moot.protocols.presets.report_rules import filtered_vote as filtered_vote
from moot.protocols.presets.report_rules import weighted_vote as weighted_vote
from moot.protocols.presets.seeds import ARGUE_OPENING as ARGUE_OPENING
from moot.protocols.presets.seeds import ARGUE_REBUTTAL as ARGUE_REBUTTAL
from moot.protocols.presets.seeds import MODERATOR as MODERATOR
from moot.protocols.presets.seeds import PANEL_SPEAKER as PANEL_SPEAKER
from moot.protocols.presets.seeds import PANEL_TEMPLATE as PANEL_TEMPLATE
from moot.protocols.presets.seeds import moderated as moderated
from moot.protocols.presets.seeds import moderated_extended as moderated_extended
from moot.protocols.presets.seeds import panel as panel
from moot.protocols.presets.shared import ANSWER_OPENING as ANSWER_OPENING
from moot.protocols.presets.shared import ANSWER_PROMPTS as ANSWER_PROMPTS
from moot.protocols.presets.shared import ANSWER_REBUTTAL as ANSWER_REBUTTAL
from moot.protocols.presets.shared import DU_GSM_REBUTTAL as DU_GSM_REBUTTAL
from moot.protocols.presets.shared import DU_OPENING as DU_OPENING
from moot.protocols.presets.shared import DU_TOGETHER as DU_TOGETHER
from moot.protocols.presets.shared import Argument as Argument
from moot.protocols.presets.shared import MadModeration as MadModeration
from moot.protocols.presets.shared import ModeratorEvaluation as ModeratorEvaluation
from moot.protocols.presets.shared import PanelSummary as PanelSummary
from moot.protocols.presets.shared import PanelTurn as PanelTurn
from moot.protocols.presets.shared import Summary as Summary
from moot.protocols.presets.shared import Wording as Wording
from moot.protocols.presets.shared import answer_prompts as answer_prompts
from moot.protocols.presets.shared import answer_turn as answer_turn
from moot.protocols.presets.shared import without_confidence as without_confidence
