"""README's examples of constrained output and tool calling run as written (a registry model)."""

import re
import subprocess
import sys

import pytest

from paths import REPO

pytestmark = pytest.mark.model


def python_example(heading: str) -> str:
    """The first ```python block after a heading of README.md."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_json_schema_example_prints_an_object_that_matches():
    lines = run(python_example("### Constrained output")).splitlines()
    city = eval(lines[0], {})  # the example prints the parsed dict
    assert set(city) == {"city", "population", "continent"} and isinstance(city["population"], int)
    assert lines[1] in (" yes", " no")
    assert re.fullmatch(r" \d{3}-\d{4}", lines[2])


def test_the_tool_calling_example_calls_the_tool_then_answers():
    lines = run(python_example("### Tool calling")).splitlines()
    finish, name, arguments = lines[0].split(" ", 2)
    assert (finish, name) == ("tool_calls", "get_weather")
    assert set(eval(arguments, {})) == {"city"}
    assert lines[1].strip()


def test_the_python_api_example_runs():
    out = run(python_example("### From Python"))
    assert re.search(r"^(stop|length) \{'prompt_tokens': \d+, 'completion_tokens': \d+, 'total_tokens': \d+\}$",
                     out, re.M), out


def test_the_llama_cpp_python_example_runs():
    lines = run(python_example("### From code written for llama-cpp-python")).splitlines()
    assert lines[0].startswith("Q: Name the planets in the solar system? A: ")
    assert lines[-1].startswith("2048 ") and lines[-1].endswith(" b'Hello'")
