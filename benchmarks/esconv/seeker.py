"""ESConv help-seeker simulator and critic prompts, after the PPDPP interactive protocol.

PPDPP (Deng et al. 2023, github.com/dengyang17/PPDPP ``prompt.py`` / ``env.py``) evaluates an
emotional-support system against an LLM "patient" seeded with an ESConv case, and after every patient
turn a critic LLM answers "has the patient's issue been solved?" with one of four verdicts mapped to
-1 / -0.5 / 0.5 / 1. These are its three prompts as chat conversations (our wording, same content);
the simulator's replies are cleaned with :func:`rapo_echo.llm.dialogue.clean_reply`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rapo_echo.llm.fencing import Fence
from rapo_echo.types import Conversation, msg

SEEKER = "seeker"
SUPPORTER = "supporter"

# PPDPP's critic verdicts and their rewards (env.py ``reward_dict['esc']``).
CRITIC_LABELS: dict[str, float] = {"worse": -1.0, "same": -0.5, "better": 0.5, "solved": 1.0}

SEEKER_SYSTEM = (
    "Now enter the role-playing mode. In the following conversation you play a patient talking to a "
    "therapist in a counselling conversation. Stay in character: you are the patient, not an assistant."
)
SEEKER_BRIEF = (
    "You are the patient who is looking for help from the therapist, because of the emotional issue "
    "described here:\n{case}\n{rules}\n"
    "Please reply with only one short and succinct sentence. Now tell me your issue."
)
CRITIC_SYSTEM = (
    "Given a conversation between a Therapist and a Patient, assess whether the Patient's emotional issue "
    "has been solved after the conversation."
)
CRITIC_QUESTION = (
    "You can only reply with one of the following words: worse (No, the Patient feels worse), "
    "same (No, the Patient feels the same), better (No, but the Patient feels better), "
    "solved (Yes, the Patient's issue has been solved).\n{rules}\n\n"
    "The Patient's issue:\n{case}\n\nThe conversation:\n{dialogue}\n\n"
    "Question: Has the Patient's issue been solved? Answer with one word."
)

@dataclass(frozen=True)
class SeekerProfile:
    """What the simulated seeker knows about itself (from the ESConv case)."""

    emotion_type: str
    problem_type: str
    situation: str


def case_block(profile: SeekerProfile, fence: Fence) -> str:
    """The ESConv case (dataset text) as one fenced block."""
    situation = profile.situation.strip()
    return fence.block(
        "CASE", f"Emotion: {profile.emotion_type}\nProblem: {profile.problem_type}\nSituation: {situation}"
    )


def case_fence(case_id: str, seed: int | None = None) -> Fence:
    """The fence of one episode: a reproducible marker from the case id and the run's seed."""
    return Fence.derived([case_id], salt=f"esconv:{seed}")


def seeker_prompt(
    profile: SeekerProfile, turns: Sequence[tuple[str, str]], fence: Fence | None = None
) -> Conversation:
    """The simulator's prompt: the role brief (the case fenced), then the dialogue seen from the seeker's
    side (its own turns as ``assistant``, the role-play itself); ``turns`` are ``(speaker, text)`` pairs
    and must end with the supporter."""
    if not turns or turns[-1][0] != SUPPORTER:
        raise ValueError("the seeker replies to the supporter: the last turn must be the supporter's")
    fence = fence or Fence.derived([profile.situation], salt="esconv")
    brief = SEEKER_BRIEF.format(case=case_block(profile, fence), rules=fence.rules())
    out: Conversation = [msg("system", SEEKER_SYSTEM), msg("user", brief)]
    out.extend(msg("assistant" if who == SEEKER else "user", text) for who, text in turns)
    return out


def supporter_prompt(system_prompt: str | None, turns: Sequence[tuple[str, str]]) -> Conversation:
    """The policy's prompt: its system prompt, then the dialogue with the seeker as ``user``."""
    if not turns or turns[-1][0] != SEEKER:
        raise ValueError("the supporter replies to the seeker: the last turn must be the seeker's")
    out: Conversation = [msg("system", system_prompt)] if system_prompt else []
    out.extend(msg("user" if who == SEEKER else "assistant", text) for who, text in turns)
    return out


def critic_prompt(
    profile: SeekerProfile, turns: Sequence[tuple[str, str]], fence: Fence | None = None
) -> Conversation:
    """The critic's prompt: PPDPP's question, the case and the whole dialogue (``Therapist: ...`` /
    ``Patient: ...`` lines) in fenced blocks. Parse its answer with
    ``parse_critic(fence.own_words(text))``."""
    fence = fence or Fence.derived([profile.situation], salt="esconv")
    lines = "\n".join(f"{'Patient' if who == SEEKER else 'Therapist'}: {text}" for who, text in turns)
    question = CRITIC_QUESTION.format(
        rules=fence.rules(), case=case_block(profile, fence), dialogue=fence.block("DIALOGUE", lines)
    )
    return [msg("system", CRITIC_SYSTEM), msg("user", question)]


def parse_critic(text: str) -> str | None:
    """The verdict label in a critic's reply: the earliest of worse / same / better / solved that occurs
    (case-insensitive, so PPDPP's full sentences parse too); None when none occurs."""
    lowered = text.lower()
    hits = [(lowered.find(label), label) for label in CRITIC_LABELS if label in lowered]
    return min(hits)[1] if hits else None
