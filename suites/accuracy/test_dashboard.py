"""The dashboard: rendered from a real store, loaded in a real headless Chromium.

Checks what a reader relies on: every gate's latest V1/V2 status, the history charts with their threshold
line, parity and warmup rows, no console errors, no network, and a hostile test id shown as text.
Install the browser with ``bash ci/install_browser.sh`` (Debian ``chromium`` + ``chromium-driver``).
"""

import os
import re
import shutil
from pathlib import Path

import pytest

from pytest_kvcm.dashboard import main, render_dashboard
from pytest_kvcm.results import ResultsStore

EVIL_ID = 'suites/x.py::test_evil[<script>window.__pwned=1</script>]'
EVIL_MODEL = '<img src=x onerror="window.__pwned=2">'
T0 = 1_767_000_000.0


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "results.sqlite"
    with ResultsStore(path, git_commit="0123456789abcdef", lane="cpu", machine="ci-box") as s:
        for run, (v1, v2) in enumerate([(41.0, 41.0), (43.5, 43.5), (44.0, 12.5)]):
            for ver, score in (("v1", v1), ("v2", v2)):
                s.record("accuracy.gsm8k-arith", score, test_id=f"suites/accuracy/test_models.py::test_gate[{ver}]",
                         model="HuggingFaceTB/SmolLM2-135M-Instruct", kvcm_version=ver, threshold=19.5, n=48,
                         passed=score >= 19.5, extra={"spec": {"dtype": "float32", "quant_algo": "Q4_1"}},
                         run_id=f"run{run}", time=T0 + 3600 * run)
        s.record("accuracy.gsm8k", 74.6, test_id="suites/gpu/test_llama.py::test_gsm8k", model="meta-llama/Llama-3.1-8B-Instruct",
                 kvcm_version="v2", threshold=70.997, n=1319, passed=True, run_id="run2", time=T0 + 7300)
        s.record("parity.v1_vs_v2", 0, test_id="suites/engine/test_parity.py::test_greedy[llama]", passed=True,
                 extra={"first_diff": None, "tokens": 640}, run_id="run2", time=T0 + 7400)
        s.record("parity.v1_vs_v2", 1, test_id="suites/engine/test_parity.py::test_greedy[qwen3]", passed=False,
                 extra={"first_diff": 17, "tokens": [1034, 2210], "margin": 0.0031}, run_id="run2", time=T0 + 7401)
        s.record("warmup.skipped", 0, test_id="suites/managers/test_warmup.py::test_no_skips[v2]", kvcm_version="v2",
                 threshold=0, passed=True, extra={"planned": 8, "captured": 8}, run_id="run2", time=T0 + 7402)
        s.record("accuracy.gsm8k", 50.0, test_id=EVIL_ID, model=EVIL_MODEL, kvcm_version="v1", threshold=60.0,
                 n=16, passed=False, run_id="run2", time=T0 + 7403)
        s.record("kv_bytes", 1.5e9, test_id=EVIL_ID, extra={"note": "</script><b>bold</b>"}, run_id="run2",
                 time=T0 + 7404)
    return path


def test_static_html_is_escaped_and_offline(store_path, tmp_path):
    out = render_dashboard(store_path, tmp_path / "d.html")
    text = out.read_text()
    assert "<script>window.__pwned" not in text and "<img src=x" not in text and "</script><b>" not in text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in text
    assert not re.search(r"(src|href)=\"(https?:)?//", text)  # nothing fetched from anywhere
    assert text.count("<script") == 2  # the JSON block and the inline script, nothing injected
    assert 'class="threshold"' in text and text.count('<svg class="chart"') == 3


def test_main_cli(store_path, tmp_path, capsys):
    assert main(["--results", str(store_path), "--out", str(tmp_path / "o.html")]) == 0
    assert (tmp_path / "o.html").stat().st_size > 1000
    assert main(["--results", str(tmp_path / "missing.sqlite"), "--out", str(tmp_path / "x.html")]) == 2
    assert "missing.sqlite: does not exist" in capsys.readouterr().err


def _chromium():
    pytest.importorskip("selenium", reason="selenium is not installed (extra: test)")
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not (binary and driver):
        pytest.skip("headless Chromium not installed: run `bash ci/install_browser.sh` "
                    "(Debian packages chromium, chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1700", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def test_dashboard_in_headless_chromium(store_path, tmp_path):
    out = render_dashboard(store_path, tmp_path / "dashboard.html")
    browser = _chromium()
    try:
        from selenium.webdriver.common.by import By

        browser.get(out.resolve().as_uri())
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert errors == [], errors
        assert browser.execute_script("return window.__pwned === undefined")
        gate_rows = browser.find_elements(By.CSS_SELECTOR, "#gate-table tbody tr")
        assert len(gate_rows) == 3  # arith SmolLM2, Llama, the hostile one
        smol = next(r for r in gate_rows if "SmolLM2" in r.text)
        assert "FAIL" in smol.text and "12.5" in smol.text and "44" in smol.text  # V2 fell, V1 did not
        cells = smol.find_elements(By.CSS_SELECTOR, "td.cell")
        assert "pass" in cells[0].text.lower() and "FAIL" in cells[1].text  # V1 column, then V2
        body = browser.find_element(By.TAG_NAME, "body").text
        assert EVIL_ID in body, body
        assert EVIL_MODEL in body, body
        assert "note=</script><b>bold</b>" in browser.find_element(By.ID, "other").text
        assert all(b.text != "bold" for b in browser.find_elements(By.CSS_SELECTOR, "b"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 3
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart path.threshold")) == 3
        parity = browser.find_element(By.ID, "parity").text
        assert "test_greedy[qwen3]" in parity and "first_diff=17" in parity
        assert "planned=8" in browser.find_element(By.ID, "warmup").text
        assert browser.find_element(By.ID, "row-count").text == "12"  # the JSON block parsed in the page
        browser.save_screenshot(str(tmp_path / "dashboard.png"))
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        keep = os.environ.get("KVCM_SCREENSHOT_DIR")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(tmp_path / "dashboard.png", Path(keep) / "dashboard.png")
        # the filter box hides non-matching rows
        box = browser.find_element(By.ID, "filter")
        box.send_keys("qwen3")
        visible = [r for r in browser.find_elements(By.CSS_SELECTOR, "tbody tr") if r.is_displayed()]
        assert len(visible) == 1 and "qwen3" in visible[0].text
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        browser.quit()
