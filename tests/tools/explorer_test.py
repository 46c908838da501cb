#!/usr/bin/env python3
"""The attention explorer in a real browser: Debian's Chromium, headless, driven by chromedriver.

    explorer_test.py QKV_BINARY SOURCE_DIR ARTIFACT_DIR

Writes `qkv viz` explorers (a built-in model with labels, a model whose heads differ), opens them
from file:// with no network, and checks: no console errors; choosing a head changes the lines
and the heatmap; hovering a query token leaves only its lines, from its row, one per key it
attends to; clicking keeps the choice; a second layer can be chosen. Saves screenshots into
ARTIFACT_DIR. Exits 77 (skipped) without Chromium or Selenium unless QKV_REQUIRE_BROWSER=1.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def skip_or_fail(why):
    if os.environ.get("QKV_REQUIRE_BROWSER") == "1":
        print("FAIL: " + why + " (QKV_REQUIRE_BROWSER=1)")
        sys.exit(1)
    print("SKIP: " + why)
    sys.exit(SKIP)


try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:
    skip_or_fail("python3-selenium is not installed")

qkv, source, artifacts = sys.argv[1], sys.argv[2], sys.argv[3]
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
driver_path = shutil.which("chromedriver")
if not chromium or not driver_path:
    skip_or_fail("chromium and chromium-driver are not installed")
os.makedirs(artifacts, exist_ok=True)
work = tempfile.mkdtemp(prefix="qkv_explorer_")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what)


def explorer(name, args):
    path = os.path.join(work, name + ".html")
    subprocess.run([qkv, "viz"] + args + ["--backend", "cpu", "--html", path], check=True, stdout=subprocess.DEVNULL)
    with open(path, encoding="utf-8") as f:
        page = f.read()
    remote = re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""", page)
    check(not remote, name + ": the page loads nothing from a network: %r" % remote)
    return path


labelled = explorer("mha", ["mha", "--set", "heads=4", "--labels", "Your,journey,starts,with,one,step"])
bert = explorer("bert", [os.path.join(source, "tests/fixtures/hf/bert-tiny"), "--prompt", "the cat sat on the mat"])

options = webdriver.ChromeOptions()
options.binary_location = chromium
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900",
             "--user-data-dir=" + os.path.join(work, "profile")):
    options.add_argument(flag)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
browser = webdriver.Chrome(service=Service(driver_path), options=options)
try:
    browser.set_network_conditions(offline=True, latency=0, throughput=0)  # a self-contained page needs none
except Exception:
    pass  # not every chromedriver speaks it; the page's text was checked for addresses above
try:
    browser.get("file://" + labelled)
    WebDriverWait(browser, 20).until(lambda b: b.execute_script("return document.body.dataset.ready") == "true")
    edges = lambda: int(browser.find_element(By.ID, "lines").get_attribute("data-edges"))
    heatmap = lambda: browser.execute_script("return document.getElementById('heatmap').toDataURL()")

    tokens = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "text.token.query")]
    check(tokens == ["Your", "journey", "starts", "with", "one", "step"], "the query column shows the labels: %r" % tokens)
    heads = [o.text for o in Select(browser.find_element(By.ID, "head")).options]
    check(heads == ["all heads", "head 1", "head 2", "head 3", "head 4"], "the head menu: %r" % heads)

    all_edges, all_map = edges(), heatmap()
    check(all_edges > 36, "all heads overlaid draw more lines than one head has cells: %d" % all_edges)
    browser.save_screenshot(os.path.join(artifacts, "explorer_all_heads.png"))

    Select(browser.find_element(By.ID, "head")).select_by_visible_text("head 2")
    one_edges, one_map = edges(), heatmap()
    check(0 < one_edges <= 36, "one head draws at most a line per query-key pair: %d" % one_edges)
    check(one_map != all_map, "choosing a head redraws the heatmap")
    check("head 2" in browser.find_element(By.ID, "map-title").text, "the heatmap says which head")

    query = browser.find_elements(By.CSS_SELECTOR, "text.token.query")[2]  # "starts"
    ActionChains(browser).move_to_element(query).perform()
    hovered = edges()
    check(0 < hovered <= 6, "hovering a query leaves its lines only, at most one per key: %d" % hovered)
    ys = set(l.get_attribute("y1") for l in browser.find_elements(By.CSS_SELECTOR, "#edges line"))
    check(len(ys) == 1, "every line starts at the hovered query: %r" % ys)
    check("starts" in browser.find_element(By.ID, "status").text, "the status line names the hovered token")
    check(heatmap() != one_map, "the hovered query's row is framed in the heatmap")

    query.click()
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "title")).perform()  # away: a kept choice stays
    check(edges() == hovered, "a clicked token keeps its lines when the pointer leaves")
    browser.save_screenshot(os.path.join(artifacts, "explorer_head2_starts.png"))
    query.click()
    ActionChains(browser).move_to_element(browser.find_element(By.ID, "title")).perform()
    check(edges() == one_edges, "clicking again lets it go: %d lines" % edges())

    layers = Select(browser.find_element(By.ID, "layer")).options
    check(len(layers) == 1 and "weights_per_head" in layers[0].text, "mha has one layer of per-head weights")

    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    check(not errors, "no console errors: %r" % errors)

    # A checkpoint: a layer menu, the tokenizer's tokens on the axes.
    browser.get("file://" + bert)
    WebDriverWait(browser, 20).until(lambda b: b.execute_script("return document.body.dataset.ready") == "true")
    layers = [o.text for o in Select(browser.find_element(By.ID, "layer")).options]
    check(len(layers) >= 2, "a layer per encoder layer: %r" % layers)
    tokens = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "text.token.query")]
    check(tokens[:2] == ["[CLS]", "the"] and tokens[-1] == "[SEP]", "the tokenizer's tokens label the model folder's explorer: %r" % tokens)
    first = heatmap()
    Select(browser.find_element(By.ID, "layer")).select_by_index(1)
    check(heatmap() != first, "another layer draws other weights")
    browser.save_screenshot(os.path.join(artifacts, "explorer_bert_layer1.png"))
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    check(not errors, "no console errors on the checkpoint's page: %r" % errors)

    # A model whose weights are not all finite (qkv writes NaN as null), and labels that would
    # end the data's <script> element if they were written as they are.
    hostile = explorer("hostile", ["mha", "--labels", "</script><b>x,<!--<script>,a&b"])
    with open(hostile, encoding="utf-8") as f:
        page = f.read()
    data = page.split('id="qkv-data"')[1].split("</script>")[0]
    check(r"\u003c/script\u003e\u003cb\u003ex" in data and r"\u003c!--\u003cscript\u003e" in data, "labels are written escaped in the data")
    start = page.index('"weights":[') + len('"weights":[')
    page = page[:start] + "null,null," + page[start + page[start:].index(",", page[start:].index(",") + 1) + 1:]
    with open(hostile, "w", encoding="utf-8") as f:
        f.write(page)
    browser.get("file://" + hostile)
    WebDriverWait(browser, 20).until(lambda b: b.execute_script("return document.body.dataset.ready") == "true")
    tokens = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "text.token.query")]
    check(tokens == ["</script><b>x", "<!--<script>", "a&b"], "hostile labels shown as written: %r" % tokens)
    ActionChains(browser).move_to_element(browser.find_elements(By.CSS_SELECTOR, "text.token.query")[0]).perform()
    check("NaN" in browser.find_element(By.ID, "status").text, "a NaN weight is named, not a broken page: %r" % browser.find_element(By.ID, "status").text)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    check(not errors, "no console errors with NaN weights: %r" % errors)
finally:
    browser.quit()
    shutil.rmtree(work, ignore_errors=True)

if failures:
    sys.exit(1)
print("explorer: every check passed; screenshots in " + artifacts)
