"""The chat page at / in a real browser: headless Chromium (Debian's chromium and
chromium-driver packages) driven by selenium, talking to a real `ember serve`."""

from __future__ import annotations

import shutil

import httpx
import pytest

from ember.hub import resolve_model
from ember_server import ServerProcess

pytestmark = pytest.mark.model

MODEL = "smollm2-135m"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("headless Chromium is not installed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server():
    resolve_model(MODEL)
    process = ServerProcess("-m", MODEL, "-c", "512", "--parallel", "2").wait_ready()
    yield process.url
    process.stop()


def test_the_chat_page_streams_the_reply_of_the_api(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")
    assert browser.title == "ember chat"
    browser.find_element(By.TAG_NAME, "summary").click()
    for field, value in (("temperature", "0"), ("max-tokens", "24")):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    browser.find_element(By.ID, "prompt").send_keys(QUESTION)
    browser.find_element(By.ID, "send").click()

    WebDriverWait(browser, 120).until(
        lambda b: b.find_element(By.CSS_SELECTOR, ".message.assistant").get_attribute("data-state") != "streaming")
    reply = browser.find_element(By.CSS_SELECTOR, ".message.assistant")
    expected = httpx.post(f"{server}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": 24}).json()
    assert reply.get_attribute("data-state") == "done"
    assert reply.get_attribute("textContent") == expected["choices"][0]["message"]["content"]
    assert int(reply.get_attribute("data-chunks")) > 1  # it arrived in pieces
    assert reply.get_attribute("data-finish-reason") == expected["choices"][0]["finish_reason"]
    assert browser.find_element(By.ID, "model").text == MODEL
