"""``examples/support.py`` (issue 16): an AI pipeline that runs offline, end to end, with a
validation loop fed the validator's reasons (including a real language model's verdict),
a fallback, a review, a budget and a rate limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from examples import support

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix

ROOT = Path(__file__).resolve().parents[2]


def test_the_language_check_is_a_real_model() -> None:
    assert support.language_of("Bonjour, ma commande n'est pas encore arrivée.")[0] == "fr"
    assert support.language_of("Hallo, meine Bestellung ist nicht angekommen.")[0] == "de"


async def test_every_request_is_answered_in_its_language(server: ServerProcess) -> None:
    results = await support.run_once(server.url, unique_prefix("support"))
    by_id = {run_id: result for run_id, result in results.items()}
    assert {r.status for r in by_id.values()} == {"succeeded"}
    assert {run_id: r.data["language"] for run_id, r in by_id.items()} == {
        "req-en-1": "en", "req-de-1": "de", "req-fr-1": "fr", "req-it-1": "it"}
    german = by_id["req-de-1"]
    attempts = [e for e in german.entries if e.get("type") == "draft:attempt"]
    verdicts = [e for e in german.entries if e.get("type") == "draft:verdict"]
    assert len(attempts) == 2  # English first, refused by the language check, then German
    assert [r["code"] for r in verdicts[0]["data"]["reasons"]] == ["wrong_language"]
    assert german.cost["tokens"] > 0
    # Italian has no template: three attempts and the fallback failed, a person answered.
    italian = by_id["req-it-1"]
    assert [(e["decision"], e["by"]) for e in italian.entries
            if e["stream"] == "review:decided"] == [("approved", "stand-in-reviewer")]
    assert italian.data["answer"] == support.REVIEWED["req-it-1"]


def test_python_dash_m_runs_offline() -> None:
    done = subprocess.run([sys.executable, "-m", "examples.support"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("req-")]
    assert [line.split()[:2] for line in lines] == [
        ["req-en-1", "succeeded"], ["req-de-1", "succeeded"], ["req-fr-1", "succeeded"],
        ["req-it-1", "succeeded"]]
