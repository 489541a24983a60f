"""docs/metrics.md is generated from the code; it must match, and name every family a real dump emits. The docs
and the code stand alone: they cite public sources, never texts a reader of the repository does not have."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO, TRL, run_cli
from prometheus_client.parser import text_string_to_metric_families

from exporter.metricdoc import render

DOC = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
GPU_DOC = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")


def test_metrics_doc_is_up_to_date() -> None:
    assert render() == DOC, "docs/metrics.md is stale: run `python scripts/gen_metrics_doc.py`"


def test_every_family_of_a_real_dump_is_documented() -> None:
    for run in ("grpo", "dpo", "sft"):
        text = run_cli("dump", str(TRL / run / "combined.log")).stdout.decode()
        for fam in text_string_to_metric_families(text):
            name = fam.name + ("_total" if fam.type == "counter" else "")
            doc = GPU_DOC if name.startswith("posttrain_gpu_") else DOC
            assert f"`{name}" in doc, f"{name} is not in docs/metrics.md (or docs/gpu.md for GPU families)"


def test_readme_prometheus_config_is_valid(tmp_path) -> None:
    """The README's prometheus.yml for a setup without Kubernetes passes promtool, with the real rules loaded."""
    import re
    import shutil
    import subprocess

    from conftest import REPO, require_binary

    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "scrape_configs:" in b)
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "rules", rules)
    (tmp_path / "prometheus.yml").write_text(block.replace("/etc/prometheus/posttrain/", f"{rules}/"))
    r = subprocess.run([require_binary("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 2 rule files found" in r.stdout, r.stdout


def test_readme_and_the_chart_scrape_at_one_interval() -> None:
    """One interval story: the README's prometheus.yml and the chart's PodMonitor scrape alike (and say why)."""
    import yaml

    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "scrape_configs:" in b)
    readme = yaml.safe_load(block)["scrape_configs"][0]["scrape_interval"]
    chart = yaml.safe_load((REPO / "helm" / "posttrain-exporter" / "values.yaml").read_text())["podMonitor"]["interval"]
    assert readme == chart, f"README scrapes every {readme}, the chart's PodMonitor every {chart}"
    assert f"Why {readme.removesuffix('s')} s" in text


# References to texts outside the repository (the notes the project grew from): their "seeds", "Part II",
# "(002)" and "practitioner's guide". A random-number seed ("seed=1", "data_seed: 10") is not one.
UNSOURCED = re.compile(
    r"\bthe seeds\b|\bseeds'|\bseed's\b|[(#]\s*seed:|\bseed (?:texts?|instruments?)\b|\bpart i{1,3}\b"
    r"|\(00\d\)|(?<![\w.,])00\d:|practitioner'?s? guide|instrument cluster", re.I)


def _published_texts() -> list[Path]:
    """Every doc, the code under exporter/, and what the chart, the boards and the rules ship."""
    files = [*REPO.glob("*.md"), *REPO.glob("bench/*.md"), *REPO.glob("rules/*.yml"), *REPO.glob("grafana/*.json")]
    for top, pattern in (("docs", "*"), ("exporter", "*.py"), ("helm", "*")):
        files += (p for p in (REPO / top).rglob(pattern) if p.is_file() and p.suffix not in {".png", ".svg", ".tgz"})
    return sorted(files)


def test_unsourced_reference_pattern() -> None:
    for bad in ("the seeds' callbacks", "the seed's len >= 20", "(seed: deque(maxlen=50))", "# seed: polyfit",
                "the seed instrument it serves", "Part II instrument 9", "Part III: loss", "Part I fundamentals",
                "(002)", "002: peak followed by decline", "the practitioner's guide", "the instrument cluster texts",
                "The seeds say"):
        assert UNSOURCED.search(bad), bad
    for fine in ("random.seed(0)", "seed=1", "data_seed: 10", "(another seed, 200 steps)", "tag:yaml.org,2002:int",
                 "0.002 s", "partial reward", "part in", "arXiv:2402.03300", "seeded script"):
        assert not UNSOURCED.search(fine), fine


def test_docs_and_modules_cite_nothing_outside_the_repository() -> None:
    files = _published_texts()
    names = {p.relative_to(REPO).as_posix() for p in files}
    assert {"README.md", "docs/derived.md", "docs/runbooks.md", "exporter/detectors/catalog.py",
            "exporter/instruments/keymap.py", "rules/posttrain.alerts.yml", "grafana/grpo.json"} <= names
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
             for p in files for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if UNSOURCED.search(line)]
    assert not found, "say the idea itself, or cite a public source:\n" + "\n".join(found)


# --- the README and the docs' links ----------------------------------------------------------------------------

README_MAX_LINES = 300  # a page for the people who deploy it; the details are in docs/
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a Markdown file: its headings' slugs (lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered) and explicit `<a id=...>`."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return [a or b for a, b in LINK.findall(text)]


def test_readme_is_short_and_every_relative_link_in_it_and_the_docs_resolves() -> None:
    readme = REPO / "README.md"
    lines = len(readme.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md is {lines} lines: move details to docs/"
    broken = []
    for page in [readme, *sorted((REPO / "docs").glob("*.md"))]:
        for link in _links(page):
            if re.match(r"[a-z]+:", link):  # https:, mailto:: not this repository's
                continue
            target, _, anchor = link.partition("#")
            dest = (page.parent / target).resolve() if target else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {link} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {link} (no such heading in {dest.relative_to(REPO)})")
    assert not broken, "\n".join(broken)


def test_anchor_slugs_are_githubs() -> None:
    page = REPO / "bench" / "README.md"
    assert {"the-trainers-output", "every-log-shape"} <= _anchors(page)


def test_no_issue_numbers_in_the_docs() -> None:
    """A reader of the repository cannot open the tracker the work was planned in: the docs say what, not which
    issue."""
    pages = [*REPO.glob("*.md"), *REPO.glob("docs/*.md"), *REPO.glob("bench/*.md"), *REPO.glob("helm/**/*.md")]
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:120]}" for p in pages
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bissues? #?\d+|#[\w-]*-issue-\d+", line, re.I)]
    assert not found, "\n".join(found)
