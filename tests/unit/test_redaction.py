"""Privacy redaction: the labelled corpus, precision/recall, linear time, settings, the component."""

# Secrets hidden behind look-alike characters are what some of these tests are about.
# ruff: noqa: RUF001

from __future__ import annotations

import functools
import json
import re
import time
import unicodedata
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
from haystack import Document, Pipeline
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_osa_memory.components.privacy_redactor import PrivacyRedactor
from haystack_osa_memory.errors import ConfigurationError, InvalidInputError
from haystack_osa_memory.privacy.redaction import (
    BUILTIN_RULES,
    CLASSES,
    PLACEHOLDER_PATTERN,
    PLACEHOLDERS,
    RedactionResult,
    compile_policy,
    redact,
)
from tests.conftest import REPO, load_benchmark

CORPUS_PATH = REPO / "tests" / "data" / "redaction_corpus.jsonl"
CASES: list[dict[str, Any]] = [json.loads(line) for line in CORPUS_PATH.read_text(encoding="utf-8").splitlines()]
CLASS_OF = {placeholder: name for name, placeholder in PLACEHOLDERS.items()}
MAX_ACCEPTED_MISSES = 3


@functools.cache
def _benchmark() -> ModuleType:
    """benchmarks/redaction.py: the scoring the benchmark prints is the scoring asserted here."""
    return load_benchmark(REPO / "benchmarks" / "redaction.py", "redaction_benchmark")


def _placeholder_counts(text: str) -> dict[str, int]:
    return dict(Counter(CLASS_OF[m.group(0)] for m in PLACEHOLDER_PATTERN.finditer(text)))


class TestCorpus:
    def test_corpus_is_large_balanced_and_consistent(self) -> None:
        assert len(CASES) >= 200
        ids = [c["id"] for c in CASES]
        assert len(set(ids)) == len(ids)
        positives = sum(bool(c["counts"]) for c in CASES)
        assert 0.4 <= positives / len(CASES) <= 0.6, f"{positives} positives of {len(CASES)}"
        assert {"log", "config", "trace", "shell", "chat", "code"} <= {c["kind"] for c in CASES}
        for case in CASES:
            assert case["counts"] == _placeholder_counts(case["expected"]), case["id"]
            assert case["id"].startswith("pos-" if case["counts"] else "neg-"), case["id"]
        for cls in CLASSES:  # every class has positives to measure recall on
            assert sum(c["counts"].get(cls, 0) for c in CASES) >= 8, cls

    @pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
    def test_case_output(self, case: dict[str, Any]) -> None:
        result = redact(case["text"])
        miss = case.get("accepted_miss")
        if miss is None:
            assert result.text == case["expected"]
            assert result.counts == case["counts"]
        else:  # a documented miss: the output is exactly the accepted one, and still not the ideal
            assert miss["reason"]
            assert result.text == miss["output"]
            assert result.text != case["expected"]

    def test_accepted_misses_are_few(self) -> None:
        misses = [c["id"] for c in CASES if "accepted_miss" in c]
        assert len(misses) <= MAX_ACCEPTED_MISSES, misses

    @pytest.mark.parametrize(
        "case", [c for c in CASES if c["counts"] and "accepted_miss" not in c], ids=lambda c: c["id"]
    )
    def test_no_redacted_value_survives(self, case: dict[str, Any]) -> None:
        spans = _benchmark().redacted_spans(case["text"], case["expected"])
        output = redact(case["text"]).text
        for start, end, _ in spans:
            value = case["text"][start:end]
            if len(value) >= 6 and value not in case["expected"]:
                assert value not in output

    def test_precision_and_recall(self) -> None:
        bench = _benchmark()
        report = bench.evaluate(CASES)
        overall = report.overall
        assert overall.precision >= 0.98, bench.format_report(report)
        assert overall.recall >= 0.98, bench.format_report(report)
        for cls in CLASSES:
            assert report.by_class[cls].expected > 0
        assert report.failures == []
        assert report.exact + len(report.accepted) == len(CASES)

    @pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
    def test_idempotent(self, case: dict[str, Any]) -> None:
        once = redact(case["text"]).text
        again = redact(once)
        assert again.text == once
        assert again.counts == {}


class TestScoring:
    def test_spans_are_recovered_from_placeholders(self) -> None:
        bench = _benchmark()
        spans = bench.redacted_spans("pw=abc at 10.0.0.1", "pw=[REDACTED-PASSWORD] at [REDACTED-PRIVATE-IP]")
        assert spans == [(3, 6, "password"), (10, 18, "private_ip")]
        assert bench.redacted_spans("abc", "xyz") is None

    def test_partial_redaction_is_a_miss_and_overreach_a_false_positive(self) -> None:
        bench = _benchmark()
        text = "password: correct horse"
        partial = bench.score_case(text, "password: [REDACTED-PASSWORD]", "password: [REDACTED-PASSWORD] horse")
        assert (partial["password"].found, partial["password"].correct) == (0, 1)
        wide = bench.score_case("pw=a b", "pw=[REDACTED-PASSWORD] b", "pw=[REDACTED-PASSWORD]")
        assert (wide["password"].found, wide["password"].correct) == (1, 0)


class TestRedact:
    def test_docstring_example(self) -> None:
        result = redact("ssh alice@10.0.3.7 -i /home/alice/.ssh/id_ed25519; PGPASSWORD=hunter2 psql")
        assert result == RedactionResult(
            text="ssh alice@[REDACTED-PRIVATE-IP] -i [REDACTED-USER-PATH]/.ssh/id_ed25519; "
            "PGPASSWORD=[REDACTED-PASSWORD] psql",
            counts={"password": 1, "user_path": 1, "private_ip": 1},
        )
        assert result.total == 3

    def test_nothing_to_redact(self) -> None:
        assert redact("") == RedactionResult(text="", counts={})
        assert redact("deploys need the VPN").total == 0

    def test_classes_can_be_switched_off(self) -> None:
        text = "host 10.0.0.5, password=hunter2, key AKIAIOSFODNN7EXAMPLE"
        only_ip = redact(text, enabled_classes=["private_ip"])
        assert only_ip.text == "host [REDACTED-PRIVATE-IP], password=hunter2, key AKIAIOSFODNN7EXAMPLE"
        assert only_ip.counts == {"private_ip": 1}
        assert redact(text, enabled_classes=[]).text == text
        no_secret = redact("password=ghp_" + "a1B2" * 9, enabled_classes=["password"])
        assert no_secret.text == "password=[REDACTED-PASSWORD]"  # the password rule still protects it

    def test_extra_pattern_whole_match_and_value_group(self) -> None:
        extra = {
            "email": {"regex": r"[\w.+-]+@[\w-]+\.[\w.]+\w", "placeholder": "[REDACTED-EMAIL]"},
            "employee": {"regex": r"employee (?P<value>E\d{6})", "placeholder": "[REDACTED-EMPLOYEE-ID]"},
        }
        result = redact("mail bob@example.com about employee E123456 on 10.1.1.1", extra_patterns=extra)
        assert result.text == "mail [REDACTED-EMAIL] about employee [REDACTED-EMPLOYEE-ID] on [REDACTED-PRIVATE-IP]"
        assert result.counts == {"private_ip": 1, "email": 1, "employee": 1}
        assert compile_policy(None, extra).classes == (*CLASSES, "email", "employee")

    def test_text_must_be_a_string(self) -> None:
        with pytest.raises(InvalidInputError, match="text must be a string"):
            redact(b"password=x")  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            (
                {"enabled_classes": ["ip"]},
                r"Unknown redaction class\(es\) \['ip'\]. Supported classes are: \['private_key'",
            ),
            ({"enabled_classes": "jwt"}, "must be a list of class names from"),
            ({"enabled_classes": [1]}, "must be a list of class names from"),
            ({"extra_patterns": ["x"]}, "extra_patterns must be a dict"),
            ({"extra_patterns": {"Bad-Name": {"regex": "x", "placeholder": "[REDACTED-X]"}}}, "use 1 to 64 of a-z"),
            ({"extra_patterns": {"jwt": {"regex": "x", "placeholder": "[REDACTED-X]"}}}, "is a built-in class"),
            ({"extra_patterns": {"x": {"regex": "x"}}}, r"exactly the keys \['regex', 'placeholder'\]"),
            ({"extra_patterns": {"x": {"regex": "x", "placeholder": "[X]", "flags": "i"}}}, "exactly the keys"),
            ({"extra_patterns": {"x": "x"}}, "must be a dict with exactly the keys"),
            ({"extra_patterns": {"x": {"regex": "", "placeholder": "[REDACTED-X]"}}}, "non-empty string"),
            ({"extra_patterns": {"x": {"regex": "(", "placeholder": "[REDACTED-X]"}}}, "does not compile"),
            ({"extra_patterns": {"x": {"regex": "a*", "placeholder": "[REDACTED-X]"}}}, "matches the empty string"),
            ({"extra_patterns": {"x": {"regex": "x", "placeholder": "***"}}}, r"use '\[REDACTED-<NAME>\]'"),
            ({"extra_patterns": {"x": {"regex": "REDACTED", "placeholder": "[REDACTED-X]"}}}, "its own placeholder"),
        ],
    )
    def test_bad_settings_are_refused(self, kwargs: dict[str, Any], message: str) -> None:
        with pytest.raises(ConfigurationError, match=message):
            redact("text", **kwargs)
        with pytest.raises(ConfigurationError, match=message):
            PrivacyRedactor(**kwargs)

    def test_rule_names_are_unique_and_classes_known(self) -> None:
        names = [rule.name for rule in BUILTIN_RULES]
        assert len(set(names)) == len(names)
        assert {rule.cls for rule in BUILTIN_RULES} == set(CLASSES)

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
    def test_any_text_is_handled_and_idempotent(self, text: str) -> None:
        once = redact(text)
        assert sum(once.counts.values()) == len(PLACEHOLDER_PATTERN.findall(once.text)) - len(
            PLACEHOLDER_PATTERN.findall(text)
        )
        assert redact(once.text).text == once.text

    @settings(max_examples=200, deadline=None)
    @given(
        prefix=st.sampled_from(["", "use ", "token ", "(", "key=", '"', "Authorization: token "]),
        body=st.text(
            alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=36, max_size=36
        ),
        kind=st.sampled_from(["ghp_", "gho_", "ghs_"]),
        suffix=st.sampled_from(["", " ", ".", ",", '"', ")", "\n", " and more"]),
    )
    def test_generated_github_tokens_never_survive(self, prefix: str, body: str, kind: str, suffix: str) -> None:
        result = redact(f"{prefix}{kind}{body}{suffix}")
        assert body not in result.text
        assert result.counts == {"secret": 1}


# One token of every shape the token rules know, and its class.
TOKENS = {
    "aws_akia": ("AKIAIOSFODNN7EXAMPLF", "secret"),
    "aws_asia": ("ASIAQ2RRZ4KXN7EXAMPL", "secret"),
    "github": ("ghp_" + "a1B2c3D4e5" * 4, "secret"),
    "github_pat": ("github_pat_11ABCDEFG0" + "aB3dE6" * 10, "secret"),
    "gitlab": ("glpat-" + "aB3dE6xY9z" * 2, "secret"),
    "slack": ("xoxb-1234567890-1234567890-" + "aB3dE6" * 4, "secret"),
    "stripe_live": ("sk_live_" + "a1B2c3D4" * 3, "secret"),
    "stripe_restricted": ("rk_test_" + "a1B2c3D4" * 3, "secret"),
    "stripe_webhook": ("whsec_" + "a1B2c3D4" * 4, "secret"),
    "openai": ("sk-proj-" + "aB3dE6" * 5, "secret"),
    "google_api": ("AIzaSyB" + "aB3dE6xY9" * 3 + "Q0_-Z", "secret"),
    "google_oauth": ("ya29.a0Af" + "aB3dE6" * 5, "secret"),
    "npm": ("npm_" + "a1B2c3D4e5" * 3 + "a1B2c3", "secret"),
    "pypi": ("pypi-AgEIcHlwaS5vcmc" + "aB3dE6" * 8, "secret"),
    "huggingface": ("hf_" + "aB3dE6" * 6, "secret"),
    "sendgrid": ("SG." + "aB3dE6xY9z" * 2 + "Q1." + "aB3dE6xY9z" * 4 + "Q1w", "secret"),
    "dockerhub": ("dckr_pat_" + "aB3dE6" * 4, "secret"),
    "osa_memory": ("osam_0123456789abcdef_" + "aB3dE6" * 7 + "Z", "secret"),
    "telegram": ("123456789:AA" + "aB3dE6xY9z" * 3 + "Q1w", "secret"),
    "discord": ("MTA" + "aB3dE6" * 3 + "xYz1Q2." + "Gabcde." + "aB3dE6" * 5, "secret"),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.abcDEF123_-x", "jwt"),
}
# A name glued to the token with a separator: the token still starts a word of its own.
SEPARATED = ["x-", "key_", "url-", "X-Api-Key-", "my_app_", "a-b_"]


class TestTokenBoundaries:
    @pytest.mark.parametrize("prefix", SEPARATED)
    @pytest.mark.parametrize("kind", list(TOKENS))
    def test_tokens_after_a_separator_are_redacted(self, kind: str, prefix: str) -> None:
        token, cls = TOKENS[kind]
        assert redact(token).counts == {cls: 1}, "the bare token is found"
        result = redact(f"leaked {prefix}{token} in the log")
        assert result.text == f"leaked {prefix}{PLACEHOLDERS[cls]} in the log"
        assert result.counts == {cls: 1}

    @pytest.mark.parametrize(
        ("word", "kind", "after"),
        [
            ("aws", "aws_akia", ""),
            ("key", "aws_asia", ","),
            ("google", "google_api", ""),
            ("mail", "sendgrid", " sent"),
            ("https://api.telegram.org/bot", "telegram", "/sendMessage"),
        ],
    )
    def test_capital_or_digit_led_tokens_glued_to_a_word_are_redacted(self, word: str, kind: str, after: str) -> None:
        token, _ = TOKENS[kind]
        result = redact(f"{word}{token}{after}")
        assert result == RedactionResult(text=f"{word}[REDACTED-SECRET]{after}", counts={"secret": 1})

    @pytest.mark.parametrize(
        "text",
        [
            "risk-AssessmentModelV2Final2024 is the branch",  # risk + sk-…: an ordinary word
            "Ask-MeAnythingSession2024Recap notes",  # Ask + sk-…
            "disk-UsageMonitor-v2-prod-eu1 alert",
            "run task_test_ValidatesInputCorrectly1 again",  # task + sk_test_…
            "network_test_Loopback2Interface01 passed",  # network + rk_test_…
            "weighs_ComputeTheAverageOfAllTheValuesInArray",  # weighs + ghs_…
            "pnpm_storeDirectoryForTheWorkspaceRoot123",  # pnpm + npm_…
            "xghp_" + "a1B2c3D4e5" * 4,  # the tail of a longer run
            "Xghp_" + "a1B2c3D4e5" * 4,
            "1AKIAIOSFODNN7EXAMPLF",
            "SLOVAKIAIOSFODNN7EXAMPLF",
            "surveyeyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.abcDEF123_-x",  # a word that labels nothing
            "getOrganizationServiceFactory.create.InstanceOfTheServiceProviderXyz",  # discord's shape
            "chat:123456789:AA" + "aB3dE6xY9z" * 3 + "Q1w",
        ],
    )
    def test_prefixes_inside_words_and_runs_stay(self, text: str) -> None:
        assert redact(text) == RedactionResult(text=text, counts={})


def _rep(unit: str, size: int = 100_000) -> str:
    return (unit * (size // len(unit) + 1))[:size]


ADVERSARIAL = {
    "letters": "a" * 100_000,
    "digits": "1" * 100_000,
    "dotted_numbers": _rep("10.0.0."),
    "ipv6_prefixes": _rep("fe80:"),
    "jwt_headers": _rep("eyJ"),
    "jwt_like": _rep("eyJaaaaaaaaaa."),
    "pem_headers": _rep("-----BEGIN PRIVATE KEY-----"),
    "pem_unterminated": "-----BEGIN PRIVATE KEY-----\n" + "A" * 100_000,
    "pem_lines": _rep("-----BEGIN PRIVATE KEY-----\n" + "A" * 64 + "\n"),
    "dashes": "-" * 100_000,
    "password_eq": _rep("password="),
    "password_values": _rep("password=a "),
    "password_colon": _rep("password: a "),
    "password_quote": _rep('password="' + "a" * 600),
    "key_prefixes": _rep("db_password_"),
    "urls": _rep("x://u:p"),
    "url_userinfo": _rep("ab://" + "c" * 100 + ":" + "d" * 200),
    "homes": _rep("/home/"),
    "long_user": "/home/" + "a" * 100_000,
    "windows_spaces": "C:\\Users\\" + _rep("ab "),
    "github_prefixes": _rep("ghp_"),
    "openai_like": "sk-" + "aA1" * 33_333,
    "bearer": "Bearer " + "a" * 100_000,
    "mysql": _rep("mysql -pX "),
    "curl": _rep("curl -u a:b "),
    "sshpass": _rep("sshpass -p "),
    "netrc_whitespace": "machine x" + " " * 100_000,
    "xml": _rep("<password>" + "a" * 100),
    "ampersands": "password=" + _rep("&a"),
    "yaml_lines": _rep("password: a b c d e f\n"),
    "backslashes": "\\" * 100_000,
    "separated_jwts": _rep("eyJ-"),
    "separated_labels": _rep("a-eyJhbGciOiJ_"),
    "separated_tokens": _rep("-AKIA_ghp_sk-aB1_"),
    "camel_case_tokens": _rep("aAKIAAAAAAAAAAAAAAAAbAIza"),
    "every_trigger": _rep(
        "password token secret key ghp_ xoxb- eyJ -----BEGIN :// curl -p machine configure "
        "authorization bearer -- < /home/ /Users/ C:\\ ip-10- 10.0.0. fd00: sk- hf_ AKIA sig= "
    ),
}


class TestLinearTime:
    @pytest.mark.parametrize("name", list(ADVERSARIAL))
    def test_100kb_of_adversarial_input_under_a_second(self, name: str) -> None:
        text = ADVERSARIAL[name]
        assert len(text) >= 100_000
        start = time.perf_counter()
        redact(text)
        assert time.perf_counter() - start < 1.0


class TestPrivacyRedactor:
    def test_init_default(self) -> None:
        r = PrivacyRedactor()
        assert (r.enabled_classes, r.extra_patterns) == (None, None)

    def test_to_dict(self) -> None:
        extra = {"ticket": {"regex": r"INC-\d+", "placeholder": "[REDACTED-TICKET]"}}
        data = PrivacyRedactor(enabled_classes=["secret", "jwt"], extra_patterns=extra).to_dict()
        assert data == {
            "type": "haystack_osa_memory.components.privacy_redactor.PrivacyRedactor",
            "init_parameters": {"enabled_classes": ["secret", "jwt"], "extra_patterns": extra},
        }

    def test_from_dict(self) -> None:
        data = {
            "type": "haystack_osa_memory.components.privacy_redactor.PrivacyRedactor",
            "init_parameters": {"enabled_classes": ["private_ip"], "extra_patterns": None},
        }
        r = PrivacyRedactor.from_dict(data)
        assert r.enabled_classes == ["private_ip"]
        out = r.run(documents=[Document(content="10.0.0.1 password=x1")])
        assert out["documents"][0].content == "[REDACTED-PRIVATE-IP] password=x1"

    def test_from_dict_validates(self) -> None:
        data = {
            "type": "haystack_osa_memory.components.privacy_redactor.PrivacyRedactor",
            "init_parameters": {"enabled_classes": ["ipv4"]},
        }
        with pytest.raises(ConfigurationError, match="Supported classes are"):
            PrivacyRedactor.from_dict(data)

    def test_run_redacts_counts_and_never_mutates(self) -> None:
        docs = [
            Document(content="DB at 10.0.3.7, password=hunter2", meta={"topic": "db"}),
            Document(content="nothing private here"),
            Document(content="token ghp_" + "x1Y2" * 9 + " and fd12:3456::1"),
        ]
        originals = [(d.id, d.content, dict(d.meta)) for d in docs]
        out = PrivacyRedactor().run(documents=docs)
        assert [(d.id, d.content, d.meta) for d in docs] == originals  # inputs untouched
        contents = [d.content for d in out["documents"]]
        assert contents == [
            "DB at [REDACTED-PRIVATE-IP], password=[REDACTED-PASSWORD]",
            "nothing private here",
            "token [REDACTED-SECRET] and [REDACTED-PRIVATE-IP]",
        ]
        assert [d.meta for d in out["documents"]] == [
            {"topic": "db", "redactions": 2},
            {"redactions": 0},
            {"redactions": 2},
        ]
        assert out["redactions"] == 4
        assert out["redactions_by_class"] == {"secret": 1, "password": 1, "private_ip": 2}

    def test_run_recomputes_content_derived_ids_and_keeps_given_ids(self) -> None:
        auto = Document(content="password=hunter2")
        given_id = Document(id="fact-1", content="password=hunter2")
        out = PrivacyRedactor().run(documents=[auto, given_id])["documents"]
        assert out[0].id == Document(content="password=[REDACTED-PASSWORD]", meta={"redactions": 1}).id
        assert out[0].id != auto.id
        assert out[1].id == "fact-1"

    def test_run_drops_embeddings_of_redacted_documents(self) -> None:
        docs = [Document(content="password=hunter2", embedding=[0.1, 0.2]), Document(content="ok", embedding=[0.3])]
        out = PrivacyRedactor().run(documents=docs)["documents"]
        assert out[0].embedding is None
        assert out[1].embedding == [0.3]

    def test_run_passes_documents_without_text(self) -> None:
        doc = Document(content=None, meta={"kind": "blob"})
        out = PrivacyRedactor().run(documents=[doc])
        assert out["documents"] == [doc]
        assert (out["redactions"], out["redactions_by_class"]) == (0, {})

    def test_docstring_example(self) -> None:
        redactor = PrivacyRedactor(
            extra_patterns={"email": {"regex": r"[\w.+-]+@[\w-]+\.[\w.]+", "placeholder": "[REDACTED-EMAIL]"}}
        )
        out = redactor.run(documents=[Document(content="DB at 10.0.3.7, password=hunter2, ask bob@example.com")])
        assert out["documents"][0].content == (
            "DB at [REDACTED-PRIVATE-IP], password=[REDACTED-PASSWORD], ask [REDACTED-EMAIL]"
        )
        assert (out["redactions"], out["redactions_by_class"]) == (3, {"password": 1, "private_ip": 1, "email": 1})
        doc = PrivacyRedactor.__doc__ or ""
        assert "DB at [REDACTED-PRIVATE-IP], password=[REDACTED-PASSWORD], ask [REDACTED-EMAIL]" in doc

    def test_pipeline_yaml_round_trip(self) -> None:
        pipe = Pipeline()
        pipe.add_component("redact", PrivacyRedactor(enabled_classes=["secret", "password"]))
        loaded = Pipeline.loads(pipe.dumps(), allowed_modules=["haystack_osa_memory.*"])
        assert loaded.to_dict() == pipe.to_dict()
        out = loaded.run({"redact": {"documents": [Document(content="api_key: 'abc123def456'")]}})
        assert out["redact"]["documents"][0].content == "api_key: '[REDACTED-SECRET]'"
        assert out["redact"]["redactions_by_class"] == {"secret": 1}


def test_placeholders_match_their_pattern() -> None:
    for placeholder in PLACEHOLDERS.values():
        assert PLACEHOLDER_PATTERN.fullmatch(placeholder)
        assert re.escape(placeholder)


AWS = "AKIAIOSFODNN7EXAMPLE"
#: Pieces of text that secrets are hidden with, and that look like the start of one.
HIDING_PIECES = [
    *("token", "host", "key=", "password=", "10.12.34.56", "xoxb-", "AKIA", "ghp_", "eyJ", "%3A", "%40", "://"),
    *("a1B2c3D4e5f6", " ", "\u200b", "\u0301", "Ａ", "０", "：", "＠", "日本", "\U0001d400", "\x00", "\ud800"),
]
JWT_TOKEN = TOKENS["jwt"][0]
SLACK = "xoxb-" + "1234567890-" + "aB3dE6xY9z" * 2


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


class TestHiddenSecrets:
    """Secrets written so that a pattern over plain ASCII misses them: look-alike characters, characters that
    draw nothing, encodings, a label glued on. Only the secret goes; the rest of the text stays as given."""

    @pytest.mark.parametrize(
        ("text", "expected", "counts"),
        [
            # URL-encoded connection strings, once and twice, and JSON-escaped ones
            (
                "dsn=postgresql%3A%2F%2Fadmin%3AS3cr3tPw%40db%2Fapp",
                "dsn=postgresql%3A%2F%2Fadmin%3A[REDACTED-PASSWORD]%40db%2Fapp",
                {"password": 1},
            ),
            (
                "next=mysql%253A%252F%252Froot%253Ahunter2%2540db.internal&x=1",
                "next=mysql%253A%252F%252Froot%253A[REDACTED-PASSWORD]%2540db.internal&x=1",
                {"password": 1},
            ),
            (
                '{"url": "postgresql:\\/\\/app:pa55word@db:5432\\/app"}',
                '{"url": "postgresql:\\/\\/app:[REDACTED-PASSWORD]@db:5432\\/app"}',
                {"password": 1},
            ),
            # characters that draw nothing, inside the secret and inside its key
            (f"key {AWS[:4]}\u200b{AWS[4:]}", "key [REDACTED-SECRET]", {"secret": 1}),
            (f"key {AWS[:8]}\u2060\u00ad{AWS[8:]}\ufeff done", "key [REDACTED-SECRET]\ufeff done", {"secret": 1}),
            (f"{AWS[:10]}\ufe0f{AWS[10:]}", "[REDACTED-SECRET]", {"secret": 1}),
            ("pass\u200bword=hunter2x in prod", "pass\u200bword=[REDACTED-PASSWORD] in prod", {"password": 1}),
            (f"A\u0301{AWS[1:]}", "[REDACTED-SECRET]", {"secret": 1}),
            # compatibility forms (NFKC): fullwidth, mathematical letters, fullwidth digits of an address
            (f"key {_fullwidth(AWS)} leaked", "key [REDACTED-SECRET] leaked", {"secret": 1}),
            (
                "ｐａｓｓｗｏｒｄ＝ｈｕｎｔｅｒ２ は本番用",
                "ｐａｓｓｗｏｒｄ＝[REDACTED-PASSWORD] は本番用",
                {"password": 1},
            ),
            ("接続先 １０．１２．３４．５６ です", "接続先 [REDACTED-PRIVATE-IP] です", {"private_ip": 1}),
            ("\U0001d400\U0001d40a\U0001d408\U0001d400" + AWS[4:], "[REDACTED-SECRET]", {"secret": 1}),
            # a label glued on
            ("host10.12.34.56 is down", "host[REDACTED-PRIVATE-IP] is down", {"private_ip": 1}),
            ("ip192.168.1.20, gw172.16.0.1", "ip[REDACTED-PRIVATE-IP], gw[REDACTED-PRIVATE-IP]", {"private_ip": 2}),
            (f"token{SLACK}", "token[REDACTED-SECRET]", {"secret": 1}),
            (f"bearer{JWT_TOKEN}", "bearer[REDACTED-JWT]", {"jwt": 1}),
            (f"Authorization: Bearer{JWT_TOKEN}", "Authorization: Bearer[REDACTED-JWT]", {"jwt": 1}),
            ("apikeyghp_" + "a1B2c3D4e5" * 4, "apikey[REDACTED-SECRET]", {"secret": 1}),
            ("secretsk_live_" + "a1B2c3D4" * 3, "secret[REDACTED-SECRET]", {"secret": 1}),
            # both at once
            (f"token\u200b{_fullwidth(SLACK)}", "token\u200b[REDACTED-SECRET]", {"secret": 1}),
        ],
    )
    def test_hidden_secrets_are_redacted(self, text: str, expected: str, counts: dict[str, int]) -> None:
        result = redact(text)
        assert result == RedactionResult(text=expected, counts=counts)
        assert redact(result.text) == RedactionResult(text=expected, counts={})

    @pytest.mark.parametrize(
        "text",
        [
            "日本語のテキスト（テスト）：ＯＫ、１０時に集合",  # fullwidth punctuation and digits in prose
            "👨\u200d👩\u200d👧 family emoji with joiners",
            "می\u200cخواهم بروم",  # a zero-width non-joiner inside a Persian word
            "Café crème — naïve façade, ﬁnal ①②③ ² ³",
            "agent v10.1.0.7 connected; build１０．１．０．７",  # versions stay, in any width
            "survey10.12.34.56 is a version-like id, not after a label",
            "https%3A%2F%2Fexample.com%2Fsearch%3Fq%3Da%40b",  # an encoded URL without a password
            "mailto%3Aalice%40example.com",
            "xghp_" + "a1B2c3D4e5" * 4,  # still the tail of a longer run
            "keynote\u200b 2026 slides",
        ],
    )
    def test_text_without_secrets_stays_as_given(self, text: str) -> None:
        assert redact(text) == RedactionResult(text=text, counts={})

    def test_only_the_secret_changes(self) -> None:
        text = f"ＯＫ: {_fullwidth(AWS)} — ｍａｙｂｅ\u200b later, host10.0.0.9"
        assert redact(text).text == "ＯＫ: [REDACTED-SECRET] — ｍａｙｂｅ\u200b later, host[REDACTED-PRIVATE-IP]"

    @pytest.mark.parametrize("name", ["fullwidth", "zero_width", "encoded_userinfo", "combining"])
    def test_100kb_of_hidden_forms_under_a_second(self, name: str) -> None:
        text = {
            "fullwidth": _rep(_fullwidth("password=a ") + "\u200b"),
            "zero_width": _rep("AKIA\u200b"),
            "encoded_userinfo": _rep("a%3A%2F%2Fb%3A" + "c" * 50),
            "combining": _rep("A\u0301"),
        }[name]
        start = time.perf_counter()
        redact(text)
        assert time.perf_counter() - start < 1.0

    @settings(max_examples=300, deadline=None)
    @given(
        body=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16),
        hidden=st.lists(
            st.tuples(
                st.integers(1, 19), st.sampled_from(["\u200b", "\u2060", "\ufeff", "\u00ad", "\ufe0f", "\u0301"])
            ),
            max_size=4,
        ),
        wide=st.sets(st.integers(0, 19)),
    )
    def test_an_access_key_never_survives_hiding(
        self, body: str, hidden: list[tuple[int, str]], wide: set[int]
    ) -> None:
        chars = [_fullwidth(c) if i in wide else c for i, c in enumerate("AKIA" + body)]
        for position, mark in sorted(hidden, reverse=True):
            chars.insert(position, mark)
        assert redact(f"key {''.join(chars)} end") == RedactionResult(
            text="key [REDACTED-SECRET] end", counts={"secret": 1}
        )

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.sampled_from(HIDING_PIECES), max_size=30).map("".join))
    def test_hidden_forms_change_nothing_but_what_is_redacted(self, text: str) -> None:
        once = redact(text)
        assert _benchmark().redacted_spans(text, once.text) is not None  # the rest of the text is as given
        assert redact(once.text) == RedactionResult(text=once.text, counts={})

    def test_every_compatibility_form_of_ascii_is_folded(self) -> None:
        from haystack_osa_memory.privacy.redaction import _fold_table

        table = _fold_table()
        for cp in range(0x80, 0x110000):
            folded = unicodedata.normalize("NFKC", chr(cp))
            if len(folded) == 1 and folded.isascii():
                assert table.get(cp) == folded, f"U+{cp:04X}"
