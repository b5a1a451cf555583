"""Ask the real sglang 0.5.23 how its glm45 reasoning parser and glm47 tool-call parser turn raw GLM-5 output into
the reply's message (content, reasoning_content, tool_calls), as serving_chat.py's non-streaming path does; print JSON.

Run with .venv-bench's python (the image's sglang with transformers, which the parsers import).
stdin: {"cases": [{"text": RAW, "thinking": bool, "tools": [OpenAI tool, ...]}, ...]}
stdout: ORACLE-JSON {"messages": [{"content", "reasoning_content", "tool_calls"}, ...]}
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser


def message(case: dict[str, Any]) -> dict[str, Any]:
    """serving_chat.py's order: reasoning split first (force_reasoning when thinking is on: GLM-5's template opens
    the think block itself), then tool calls parsed out of what is left."""
    parser = ReasoningParser(model_type="glm45", stream_reasoning=False, force_reasoning=case["thinking"])
    reasoning, text = parser.parse_non_stream(case["text"])
    calls = None
    if case.get("tools"):
        tools = FunctionCallParser([Tool(**tool) for tool in case["tools"]], "glm47")
        if tools.has_tool_call(text):
            text, found = tools.parse_non_stream(text)
            calls = [
                {"type": "function", "function": {"name": c.name, "arguments": c.parameters}} for c in found
            ]
    return {"content": text or "", "reasoning_content": reasoning or None, "tool_calls": calls}


def main() -> None:
    request = json.load(sys.stdin)
    print("ORACLE-JSON " + json.dumps({"messages": [message(case) for case in request["cases"]]}))


if __name__ == "__main__":
    main()
