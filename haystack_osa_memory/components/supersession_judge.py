from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from haystack import component, default_to_dict
from haystack.core.serialization import component_from_dict, component_to_dict, import_class_by_name
from haystack.dataclasses import ChatMessage

logger = logging.getLogger(__name__)

JUDGE_PROMPT = """You keep an engineering team's memory. Does the NEW fact replace the OLD fact, i.e. is it \
about the same subject and states a changed value, so that the OLD fact no longer holds?
OLD: {old}
NEW: {new}
Answer with one word: yes or no."""


@component
class SupersessionJudge:
    """Asks any Haystack chat generator which suggested facts a newly stored fact replaces, within a budget.

    One question per suggestion, for the first `max_calls` suggestions (the rest stay `undecided`), all
    within `timeout` seconds. When the generator fails or answers late, nothing is decided: every
    suggestion is returned as `undecided` (the caller offers them as suggestions) with a `degraded`
    reason. Answers other than a leading *yes* count as *no*.

    Usage example:
    ```python
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.utils import Secret
    from haystack_osa_memory.components.supersession_judge import SupersessionJudge

    judge = SupersessionJudge(
        chat_generator=OpenAIChatGenerator(
            model="llama3.2", api_base_url="http://localhost:11434/v1", api_key=Secret.from_env_var("JUDGE_API_KEY")
        ),
        timeout=10.0,
        max_calls=4,
    )
    old = {"document_id": "d1", "content": "The API listens on 8080"}
    out = judge.run(fact="The API listens on 9090", candidates=[old])
    out["superseded"], out["undecided"], out["degraded"]   # (["d1"], [], None)
    ```
    """

    def __init__(self, chat_generator: Any, timeout: float = 10.0, max_calls: int = 8) -> None:
        """
        :param chat_generator: Any Haystack chat generator (`run(messages=[ChatMessage]) -> {"replies": [...]}`).
        :param timeout: Seconds all questions of one store may take together; past it nothing is decided.
        :param max_calls: Questions per store at most; suggestions past it stay undecided.
        :raises ValueError: the generator is not a component, or a budget is not positive.
        """
        if not hasattr(chat_generator, "run"):
            msg = f"chat_generator must be a Haystack chat generator component, got {type(chat_generator).__name__}"
            raise ValueError(msg)
        if timeout <= 0:
            msg = f"timeout must be positive seconds, got {timeout}"
            raise ValueError(msg)
        if max_calls < 1:
            msg = f"max_calls must be at least 1, got {max_calls}"
            raise ValueError(msg)
        self.chat_generator = chat_generator
        self.timeout = timeout
        self.max_calls = max_calls
        self._warmed = False
        self._lock = threading.Lock()
        # Its own workers: a generator stuck past the budget occupies these threads only.
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="osa-memory-judge")

    def warm_up(self) -> None:
        """Warm up the chat generator once (safe to call twice)."""
        with self._lock:
            if not self._warmed and hasattr(self.chat_generator, "warm_up"):
                self.chat_generator.warm_up()
            self._warmed = True

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            chat_generator=component_to_dict(self.chat_generator, "chat_generator"),
            timeout=self.timeout,
            max_calls=self.max_calls,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SupersessionJudge:
        params = dict(data["init_parameters"])
        inner = params["chat_generator"]
        params["chat_generator"] = component_from_dict(import_class_by_name(inner["type"]), inner, "chat_generator")
        return cls(**params)

    def _replaces(self, old: str, new: str) -> bool:
        prompt = JUDGE_PROMPT.format(old=old, new=new)
        replies = self.chat_generator.run(messages=[ChatMessage.from_user(prompt)]).get("replies") or []
        answer = (replies[0].text or "") if replies else ""
        return answer.strip().lower().startswith("yes")

    @component.output_types(superseded=list[str], undecided=list[str], degraded=str | None)
    def run(self, fact: str, candidates: list[dict[str, str]]) -> dict[str, Any]:
        """
        :param fact: The new fact, as stored (redacted).
        :param candidates: Facts it may replace: `{"document_id", "content"}` each.
        :returns: `superseded` (ids the generator says the fact replaces), `undecided` (ids left as
            suggestions: all of them when `degraded`), `degraded` (why nothing was decided, else `None`).
        """
        ids = [c["document_id"] for c in candidates]
        if not candidates:
            return {"superseded": [], "undecided": [], "degraded": None}
        try:
            self.warm_up()
        except Exception as e:  # any generator: its failure leaves the suggestions as they are
            logger.warning("the supersession judge could not be warmed up: %s", type(e).__name__)
            return {"superseded": [], "undecided": ids, "degraded": f"judge unavailable: {type(e).__name__}"}
        deadline = time.monotonic() + self.timeout
        superseded: list[str] = []
        for candidate in candidates[: self.max_calls]:
            future = self._executor.submit(self._replaces, candidate["content"], fact)
            try:
                replaces = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                future.cancel()
                logger.warning("the supersession judge exceeded its %.2f s budget", self.timeout)
                reason = f"judge exceeded its {self.timeout:.2f} s budget"
                return {"superseded": [], "undecided": ids, "degraded": reason}
            except Exception as e:  # the type only: a provider's message may quote the prompt
                logger.warning("the supersession judge failed: %s", type(e).__name__)
                return {"superseded": [], "undecided": ids, "degraded": f"judge failed: {type(e).__name__}"}
            if replaces:
                superseded.append(candidate["document_id"])
        return {"superseded": superseded, "undecided": ids[self.max_calls :], "degraded": None}
