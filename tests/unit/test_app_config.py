"""The application hook of the settings: an app's own tables, defaults, worker aliases
and secrets (``printery.AppConfig``), validated with the framework's settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from printery import AppConfig, Pipeline, Settings, SettingsTable
from printery.base.errors import ConfigError
from printery.runs.apps import DEFAULT_APP, build_pipeline, import_app, load_app_settings
from printery.settings.config_load import load_settings


class OcrSettings(SettingsTable):
    engine: str = "tesseract"
    pages: int = Field(default=10, ge=1)
    api_key_env: str = "OCR_API_KEY"


class LedgerSettings(SettingsTable):
    url: str  # required: the table must be given


APP = AppConfig(
    tables={"ocr": OcrSettings},
    defaults={"stream_prefix": "docs", "max_restarts": 7},
    worker_aliases={"read": "ocr-reader"},
    secret_envs=lambda settings: [settings.table("ocr", OcrSettings).api_key_env],
)
WORKERS = ["ocr-reader", "publisher"]


def config_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "app.toml"
    path.write_text(text)
    return {"PRINTERY_CONFIG": str(path)}


def error_of(env: dict[str, str], app: AppConfig | None = APP, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings({}, env, app=app, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    return message


def test_framework_settings_know_no_application(tmp_path: Path) -> None:
    settings = load_settings({}, {})
    assert settings.stream_prefix == "printery"
    assert "notifier" not in Settings.model_fields and "validator" not in Settings.model_fields
    message = error_of(config_file(tmp_path, "[notifier]\nretries = 1\n"), app=None)
    assert message.startswith("invalid notifier (config file ")
    assert "no such key" in message


def test_app_tables_are_validated_with_one_line_errors(tmp_path: Path) -> None:
    env = config_file(tmp_path, '[ocr]\nengine = "paddle"\npages = 3\n')
    settings = load_settings({}, env, app=APP)
    assert settings.table("ocr", OcrSettings) == OcrSettings(engine="paddle", pages=3)
    bad = error_of(config_file(tmp_path, "[ocr]\npages = 0\n"))
    assert bad.startswith("invalid ocr.pages (config file ") and bad.endswith("(an integer >= 1)")
    assert error_of(config_file(tmp_path, "[ocr]\npages = true\n")).startswith("invalid ocr.pages")
    unknown = error_of(config_file(tmp_path, "[ocr]\nlanguage = 'de'\n"))
    assert unknown.startswith("invalid ocr.language (config file ")
    assert "known keys: engine, pages, api_key_env" in unknown
    secret = error_of(config_file(tmp_path, "[ocr]\napi_key = 'hunter2'\n"))
    assert "hunter2" not in secret and "'***'" in secret


def test_a_table_without_defaults_is_required(tmp_path: Path) -> None:
    app = AppConfig(tables={"ledger": LedgerSettings})
    assert error_of({}, app=app).startswith("invalid ledger: None (a table: url)")
    env = config_file(tmp_path, "[ledger]\nurl = 'https://u:pw@ledger'\n")
    assert load_settings({}, env, app=app).table("ledger", LedgerSettings).url.endswith("@ledger")


def test_the_first_pass_sets_app_tables_aside_but_not_unknown_keys(tmp_path: Path) -> None:
    env = config_file(tmp_path, '[ocr]\nengine = 3\napp = "mod:pipe"\n')
    # `app = ...` inside [ocr] is the table's business; the first pass only finds `app`.
    first = load_settings({}, {**env, "PRINTERY_APP": "mod:pipe"}, app_pending=True)
    assert first.app == "mod:pipe"
    env = config_file(tmp_path, 'flavour = "mint"\n[ocr]\npages = 2\n')
    assert error_of(env, app=None, app_pending=True).startswith("invalid flavour (config file ")


def test_app_defaults_sit_below_file_env_and_flags(tmp_path: Path) -> None:
    assert load_settings({}, {}, app=APP).stream_prefix == "docs"
    env = config_file(tmp_path, 'stream_prefix = "from-file"\n')
    assert load_settings({}, env, app=APP).stream_prefix == "from-file"
    assert load_settings({}, {"STREAM_PREFIX": "env"}, app=APP).stream_prefix == "env"
    assert load_settings({"max_restarts": 1}, {}, app=APP).max_restarts == 1
    assert load_settings({}, {}, app=APP).max_restarts == 7
    bad = AppConfig(defaults={"stream_prefix": "has space"})
    assert error_of({}, app=bad).startswith("invalid stream_prefix (default of the app): ")


def test_worker_aliases_apply_to_worker_and_workers_tables(tmp_path: Path) -> None:
    env = {**config_file(tmp_path, "[workers.read]\nconcurrency = 4\n"), "WORKER_MODE": "read"}
    settings = load_settings({}, env, app=APP, worker_names=WORKERS)
    assert settings.worker == "ocr-reader"
    assert settings.concurrency("ocr-reader", 1) == 4
    assert settings.selected_workers(WORKERS) == ["ocr-reader"]
    assert error_of({"WORKER_MODE": "dependency"}, worker_names=WORKERS).startswith("invalid worker")


def test_secret_envs_name_what_logs_redact() -> None:
    settings = load_settings({}, {"REDIS_URL": "redis://:pw@h:1"}, app=APP)
    assert settings.secrets({"OCR_API_KEY": "k-123", "OTHER": "x"}) == ["pw", "k-123"]
    assert load_settings({}, {}).secrets({"OCR_API_KEY": "k-123"}) == []


def test_table_accessor_checks_name_and_model() -> None:
    settings = load_settings({}, {}, app=APP)
    with pytest.raises(KeyError):
        settings.table("nope", OcrSettings)
    with pytest.raises(TypeError):
        settings.table("ocr", LedgerSettings)
    with pytest.raises(KeyError):
        load_settings({}, {}).table("ocr", OcrSettings)


def test_an_app_config_cannot_shadow_framework_settings() -> None:
    with pytest.raises(ValueError):
        AppConfig(tables={"transport": OcrSettings})
    with pytest.raises(ValueError):
        AppConfig(defaults={"no_such_setting": 1})
    with pytest.raises(ValueError):
        AppConfig(defaults={"app": "x:y"})


def test_attached_to_a_factory_or_a_pipeline() -> None:
    @APP
    def factory(settings: Settings) -> Pipeline:
        return Pipeline("p", ingress=["in"])

    assert AppConfig.of(factory) is APP
    pipeline = APP(Pipeline("q", ingress=["in"]))
    assert AppConfig.of(pipeline) is APP
    assert AppConfig.of(object()) == AppConfig()


def test_the_default_app_declares_the_contract_prefix_and_aliases() -> None:
    loaded = load_app_settings({}, {})
    assert loaded.spec == DEFAULT_APP
    assert loaded.settings.stream_prefix == "materi:events:deployment"
    assert loaded.settings.app_config.worker_aliases == {
        "dependency": "dependency-checker", "health": "health-monitor",
    }
    pipeline = build_pipeline(loaded.spec, loaded.target, loaded.settings)
    assert list(pipeline.steps) == ["validator", "dependency-checker", "health-monitor",
                                    "aggregator", "notifier"]
    assert import_app(DEFAULT_APP) is loaded.target


def test_both_passes_accept_the_apps_aliases_in_workers_tables(tmp_path: Path) -> None:
    from printery.cli.workers import resolve

    env = config_file(tmp_path, "[workers.dependency]\nconcurrency = 0\n")
    with pytest.raises(ConfigError) as info:
        resolve({}, env)
    assert str(info.value).startswith("invalid workers.dependency-checker.concurrency (config file ")
    env = config_file(tmp_path, "[workers.health]\nconcurrency = 4\n[notifier]\nretries = 0\n")
    settings, pipeline = resolve({}, {**env, "WORKER_MODE": "health"})
    assert settings.selected_workers(list(pipeline.steps)) == ["health-monitor"]
    assert settings.concurrency("health-monitor", pipeline.steps["health-monitor"].concurrency) == 4


def test_the_commands_give_every_app_the_contracts_prefix_unless_it_declares_one() -> None:
    """docs/reference.md, Commands: ``--stream-prefix`` defaults to
    ``materi:events:deployment`` whatever ``--app`` runs; an app's own default, then env
    and flags, still win."""
    from printery.runs.apps import load_app_settings

    plain = load_app_settings({"app": "examples.docflow:pipeline"}, {})
    assert plain.settings.stream_prefix == "materi:events:deployment"
    given = load_app_settings({"app": "examples.docflow:pipeline"}, {"STREAM_PREFIX": "docs"})
    assert given.settings.stream_prefix == "docs"


@pytest.mark.parametrize(("app", "table"), [
    (None, "aproval"),  # the deployment pipeline: approval, delivery_failed, branch_timeout
    ("examples.support:pipeline", "support_anwser"),  # a Loop's review_kind
])
def test_a_review_table_of_a_kind_the_pipeline_does_not_have_is_refused(
    tmp_path: Path, app: str | None, table: str
) -> None:
    """As ``[workers.<name>]`` names a worker, ``[review.<kind>]`` names a kind of the
    pipeline: a typo is one line naming the table, not a deadline that never applies."""
    from printery.cli.workers import resolve

    env = {**config_file(tmp_path, f"[review.{table}]\ntimeout = 60\n"),
           **({"PRINTERY_APP": app} if app else {})}
    with pytest.raises(ConfigError) as info:
        resolve({}, env)
    message = str(info.value)
    assert message.startswith(f"invalid review.{table} (config file "), message
    assert "\n" not in message
    assert ("approval" if app is None else "support_answer") in message


def test_review_tables_of_the_pipelines_kinds_are_taken(tmp_path: Path) -> None:
    from printery.cli.workers import resolve

    env = config_file(tmp_path, "[review.approval]\ntimeout = 60\n[review.branch_timeout]\n")
    settings, _ = resolve({}, env)
    assert settings.review_timeouts() == {"approval": 60.0}
    env = {**config_file(tmp_path, "[review.support_answer]\ntimeout = 5\n"),
           "PRINTERY_APP": "examples.support:pipeline"}
    assert resolve({}, env)[0].review_timeouts() == {"support_answer": 5.0}
    # A pipeline that declares no kind (its steps write kinds of their own) cannot be
    # checked: any table is taken.
    env = {**config_file(tmp_path, "[review.low_confidence]\ntimeout = 1\n"),
           "PRINTERY_APP": "examples.docflow:pipeline"}
    assert resolve({}, env)[0].review_timeouts() == {"low_confidence": 1.0}


def test_a_budget_review_kind_is_a_kind_of_the_pipeline(tmp_path: Path) -> None:
    from printery import Budget
    from printery.cli.workers import review_kinds

    pipeline = Pipeline("b", ingress=["in"], cost_units=["usd"],
                        budget=Budget(usd=1.0, on_exceeded="review"))
    assert review_kinds(pipeline) == ["budget_exceeded"]
    assert load_settings({}, config_file(tmp_path, "[review.budget_exceeded]\ntimeout = 9\n"),
                         review_kinds=review_kinds(pipeline)).review_timeouts() == {
        "budget_exceeded": 9.0}
    with pytest.raises(ConfigError, match=r"^invalid review\.budget \(config file .*"
                                          r"a review kind of the pipeline: budget_exceeded"):
        load_settings({}, config_file(tmp_path, "[review.budget]\ntimeout = 9\n"),
                      review_kinds=review_kinds(pipeline))


def test_printery_workers_exits_2_on_a_review_table_typo(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "printery.toml"
    cfg.write_text("[review.aproval]\ntimeout = 60\n")
    done = subprocess.run(
        [sys.executable, "-m", "printery.cli.workers", "--config", str(cfg),
         "--redis-url", "redis://127.0.0.1:1", "--http-addr", "off"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("invalid review.aproval (config file "), line
