"""Captured Gemini API streams (``streamGenerateContent?alt=sse``) for the Gemini tests.

Each ``data:`` line is copied from the public capture named above it:

- junjihashimoto/louter ``test-data/gemini/`` (gemini-2.5-flash, 2025):
  ``streaming_long/response.json``, ``streaming_function_calling/response_0.json``
  and ``response_1.json``;
- FirebaseExtended/vertexai-sdk-test-data ``mock-responses/`` (Google's mock
  responses for the Firebase AI SDKs, recorded from the API): ``googleai/
  streaming-success-basic-reply-short.txt``, ``googleai/streaming-failure-
  recitation-no-content.txt``, ``streaming-failure-finish-reason-safety.txt``,
  ``googleai/streaming-success-thinking-function-call-thought-summary-
  signature.txt``, ``googleai/streaming-success-code-execution.txt``,
  ``googleai/streaming-success-empty-parts.txt``, ``googleai/streaming-failure-
  prompt-blocked-safety.txt``;
- googleapis/python-genai ``google/genai/tests/client/test_async_stream.py``
  (``EVENT_STREAM_DATA_WITH_ERROR``, the SDK's own mid-stream error fixture);
- caugner/gemdn ``src/fixtures.rs`` (``EXAMPLE_ERROR``, the API's 503, and
  ``EXAMPLE_RESPONSE``, a gemini-pro stream of early 2024, captured as
  ``alt=json``: each array element goes on one ``data:`` line here, as
  ``alt=sse`` sends it).

Where a capture is trimmed (events left out of the middle, a long
``thoughtSignature`` shortened) the comment says so; nothing else is changed.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.guard import Usage


def ev(data: str, eol: str = "\n") -> bytes:
    """One event as the Gemini API frames it: one ``data:`` line and a blank line."""
    return f"data: {data}{eol}{eol}".encode()


def obj_ev(payload: dict[str, Any]) -> bytes:
    return ev(json.dumps(payload, ensure_ascii=False))


# -- captured streams -------------------------------------------------------------------

# louter streaming_long/response.json: its first two events, one from the middle (Google
# escapes < and > as \u003c / \u003e) and its last.
LONG = [
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "Okay, let'
        r"'s create a Tetris game in Python for the console! We'll use the `curses` library "
        r"for a full-screen, interactive experience.\n\n**Important Notes Before You Start:**"
        r'\n\n1.  **`curses"}],"role": "model"},"index": 0}],"usageMetadata": '
        r'{"promptTokenCount": 4,"candidatesTokenCount": 49,"totalTokenCount": 2095,'
        r'"promptTokensDetails": [{"modality": "TEXT","tokenCount": 4}],"thoughtsTokenCount": '
        r'2042},"modelVersion": "gemini-2.5-flash","responseId": "IZI2acSKMoWl0-kPmYj2yQc"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "` is primarily for Unix-like systems '
        r"(Linux, macOS).** It might not work out-of-the-box on Windows. For Windows, you might "
        r'need `windows-curses` (`pip install windows-curses`) or consider"}],"role": "model"},'
        r'"index": 0}],"usageMetadata": {"promptTokenCount": 4,"candidatesTokenCount": 97,'
        r'"totalTokenCount": 2143,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 4}],'
        r'"thoughtsTokenCount": 2042},"modelVersion": "gemini-2.5-flash","responseId": '
        r'"IZI2acSKMoWl0-kPmYj2yQc"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "    blocks = get_piece_blocks('
        r"temp_piece)\n\n    for x, y in blocks:\n        # Check horizontal boundaries\n"
        r'        if x \u003c 0 or x \u003e= BOARD_WIDTH:\n            return True\n        "}],'
        r'"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 4,'
        r'"candidatesTokenCount": 1563,"totalTokenCount": 3609,"promptTokensDetails": '
        r'[{"modality": "TEXT","tokenCount": 4}],"thoughtsTokenCount": 2042},"modelVersion": '
        r'"gemini-2.5-flash","responseId": "IZI2acSKMoWl0-kPmYj2yQc"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": ", hold functionality, sound, high '
        r'scores, etc."}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": '
        r'{"promptTokenCount": 4,"candidatesTokenCount": 5947,"totalTokenCount": 7993,'
        r'"promptTokensDetails": [{"modality": "TEXT","tokenCount": 4}],"thoughtsTokenCount": '
        r'2042},"modelVersion": "gemini-2.5-flash","responseId": "IZI2acSKMoWl0-kPmYj2yQc"}'
    ),
]
LONG_USAGE = Usage(input_tokens=4, output_tokens=5947, reasoning_tokens=2042)

# louter streaming_function_calling/response_0.json (thoughtSignature shortened): a function
# call, reported with finishReason STOP.
CALL = [
    ev(
        r'{"candidates": [{"content": {"parts": [{"functionCall": {"name": "getWeather","args": '
        r'{"location": "Tokyo"}},"thoughtSignature": "CikBcsjafFK168IbtVtoxVV0Tsn8O+eU45rzJahz'
        r'wuKGmMbdMdfpmNpgBwplAXLI2nyA/pIFcnZwFm+7WFmLyMd8R4DXwsjqaeAAfCKo5G1xIkbAlJp8Vevn="}],'
        r'"role": "model"},"finishReason": "STOP","index": 0,"finishMessage": "Model generated '
        r'function call(s)."}],"usageMetadata": {"promptTokenCount": 83,"candidatesTokenCount": '
        r'14,"totalTokenCount": 201,"promptTokensDetails": [{"modality": "TEXT","tokenCount": '
        r'83}],"thoughtsTokenCount": 104},"modelVersion": "gemini-2.5-flash","responseId": '
        r'"qpc2afWVFJK4vr0Pq6WiyAU"}'
    )
]

# louter streaming_function_calling/response_1.json: Japanese text (3-byte UTF-8).
JAPANESE = [
    ev(
        '{"candidates": [{"content": {"parts": [{"text": "今日の東京の天気"}],"role": "model"},'
        '"index": 0}],"usageMetadata": {"promptTokenCount": 138,"candidatesTokenCount": 4,'
        '"totalTokenCount": 142,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 138}]},'
        '"modelVersion": "gemini-2.5-flash","responseId": "45I2aaWZBumm2roPm8HR0Ao"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "は曇りで、気温は22度です。\n"}],"role": '
        r'"model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 138,'
        r'"candidatesTokenCount": 15,"totalTokenCount": 153,"promptTokensDetails": [{"modality": '
        r'"TEXT","tokenCount": 138}]},"modelVersion": "gemini-2.5-flash","responseId": '
        r'"45I2aaWZBumm2roPm8HR0Ao"}'
    ),
]
JAPANESE_TEXT = "今日の東京の天気は曇りで、気温は22度です。\n"
JAPANESE_USAGE = Usage(input_tokens=138, output_tokens=15)

# Firebase googleai/streaming-success-basic-reply-short.txt (gemini-3.1-flash-lite): no
# candidate index (proto3 JSON leaves the zero out), candidatesTokenCount only at the end.
SHORT = [
    ev(
        '{"candidates": [{"content": {"parts": [{"text": "The"}],"role": "model"}}],'
        '"usageMetadata": {"promptTokenCount": 7,"totalTokenCount": 7,"promptTokensDetails": '
        '[{"modality": "TEXT","tokenCount": 7}]},"modelVersion": "gemini-3.1-flash-lite"}'
    ),
    ev(
        '{"candidates": [{"content": {"parts": [{"text": " capital of Wyoming"}],"role": '
        '"model"}}],"usageMetadata": {"promptTokenCount": 7,"totalTokenCount": 7,'
        '"promptTokensDetails": [{"modality": "TEXT","tokenCount": 7}]},"modelVersion": '
        '"gemini-3.1-flash-lite"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": " is **Cheyenne**.\n"}],"role": '
        r'"model"},"finishReason": "STOP"}],"usageMetadata": {"promptTokenCount": 7,'
        r'"candidatesTokenCount": 10,"totalTokenCount": 17,"promptTokensDetails": [{"modality": '
        r'"TEXT","tokenCount": 7}],"candidatesTokensDetails": [{"modality": "TEXT","tokenCount": '
        r'10}]},"modelVersion": "gemini-3.1-flash-lite"}'
    ),
]
SHORT_USAGE = Usage(input_tokens=7, output_tokens=10)
STARTED_SHORT = Usage(input_tokens=7)

# Firebase googleai/streaming-failure-recitation-no-content.txt: its events 1, 4 and 9 (the
# last): the finishing candidate has no content.
RECITATION = [
    ev(
        '{"candidates": [{"content": {"parts": [{"text": "text1"}],"role": "model"}}],'
        '"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9,"promptTokensDetails": '
        '[{"modality": "TEXT","tokenCount": 9}]},"modelVersion": "gemini-3.1-flash-lite"}'
    ),
    ev(
        '{"candidates": [{"content": {"parts": [{"text": "text4"}],"role": "model"},'
        '"citationMetadata": {"citationSources": [{"startIndex": 110,"endIndex": 239,"uri": '
        '"https://www.google.com/"}]}}],"usageMetadata": {"promptTokenCount": 9,"totalTokenCount":'
        ' 9,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 9}]},"modelVersion": '
        '"gemini-3.1-flash-lite"}'
    ),
    ev(
        '{"candidates": [{"finishReason": "RECITATION","citationMetadata": {"citationSources": '
        '[{"startIndex": 793,"endIndex": 1341,"uri": "https://www.google.com/"}]}}],'
        '"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 261,"totalTokenCount": '
        '270,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 9}],'
        '"candidatesTokensDetails": [{"modality": "TEXT","tokenCount": 261}]},"modelVersion": '
        '"gemini-3.1-flash-lite"}'
    ),
]

# Firebase streaming-failure-finish-reason-safety.txt (gemini-1.5-flash, Vertex AI's safety
# ratings with scores).
SAFETY = [
    ev(
        '{"candidates": [{"content": {"parts": [{"text": "<redacted>"}],"role": "model"},'
        '"finishReason": "SAFETY","index": 0,"safetyRatings": [{"category": '
        '"HARM_CATEGORY_HATE_SPEECH","probability": "NEGLIGIBLE","probabilityScore": 0.40429688,'
        '"severity": "HARM_SEVERITY_NEGLIGIBLE","severityScore": 0.18554688},{"category": '
        '"HARM_CATEGORY_DANGEROUS_CONTENT","probability": "NEGLIGIBLE","probabilityScore": '
        '0.15820313,"severity": "HARM_SEVERITY_NEGLIGIBLE","severityScore": 0.030639648},'
        '{"category": "HARM_CATEGORY_HARASSMENT","probability": "LOW","blocked": true,'
        '"probabilityScore": 0.55078125,"severity": "HARM_SEVERITY_LOW","severityScore": '
        '0.24804688},{"category": "HARM_CATEGORY_SEXUALLY_EXPLICIT","probability": "NEGLIGIBLE",'
        '"probabilityScore": 0.17675781,"severity": "HARM_SEVERITY_NEGLIGIBLE","severityScore": '
        '0.17871094}]}],"usageMetadata": {"promptTokenCount": 10,"candidatesTokenCount": 66,'
        '"totalTokenCount": 76},"modelVersion": "gemini-1.5-flash"}'
    )
]

# Firebase googleai/streaming-success-thinking-function-call-thought-summary-signature.txt
# (thoughtSignature shortened): two thought summaries, then a function call with STOP.
THINKING_CALL = [
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "**Calculating the Days**\n\nI'
        r"'ve determined the user's request involves calculating the days until New Year's Eve. "
        r"I need to get the current date and the date of New Year's Eve. My plan involves using "
        r"`default_api.now()` to get the current date and time. Then, I can perform the "
        r'calculation to find the time difference.\n\n\n","thought": true}],"role": "model"},'
        r'"index": 0}],"usageMetadata": {"promptTokenCount": 38,"totalTokenCount": 106,'
        r'"promptTokensDetails": [{"modality": "TEXT","tokenCount": 38}],"thoughtsTokenCount": '
        r'68},"modelVersion": "gemini-2.5-flash","responseId": "48SHaPHpHKbG-8YPtZCawAk"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "**Determining the Approach**\n\nI'
        r"'m now zeroing in on the best method. Having established the core requirement -- the "
        r"number of days until New Year's Eve -- I've identified `default_api.now()` as my "
        r"primary tool for retrieving the current date. I'll need to define December 31st of the "
        r"current year. I've also recognized the need to calculate the difference, which isn't a "
        r"direct function. I'll calculate this myself after getting today's date.\n\n\n"
        r'","thought": true}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": '
        r'38,"totalTokenCount": 206,"promptTokensDetails": [{"modality": "TEXT","tokenCount": '
        r'38}],"thoughtsTokenCount": 168},"modelVersion": "gemini-2.5-flash","responseId": '
        r'"48SHaPHpHKbG-8YPtZCawAk"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"functionCall": {"name": "now","args": {}},'
        r'"thoughtSignature": "CiIBVKhc7vB+vaaq6rA/KC79Ts7iXagIOA4EBOyBFDpl+pxPCmcBVKhc7gYyIw6X0"'
        r'}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": '
        r'{"promptTokenCount": 38,"candidatesTokenCount": 6,"totalTokenCount": 212,'
        r'"promptTokensDetails": [{"modality": "TEXT","tokenCount": 38}],"thoughtsTokenCount": '
        r'168},"modelVersion": "gemini-2.5-flash","responseId": "48SHaPHpHKbG-8YPtZCawAk"}'
    ),
]

# Firebase googleai/streaming-success-code-execution.txt: server-side code execution parts.
CODE = [
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "To find the sum of the first 5 prime '
        r"numbers, we first need to identify them. The first five prime numbers are 2, 3, 5, 7, "
        r"and 11.\n\nNow, let's calculate their"
        r'"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 21,'
        r'"candidatesTokenCount": 50,"totalTokenCount": '
        r'166,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 21}],"thoughtsTokenCount": '
        r'95},"modelVersion": "gemini-2.5-flash","responseId": "RUy4aObyJcTujrEPqtKYKQ"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": " sum using a Python tool:\n\n"}],'
        r'"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 21,'
        r'"candidatesTokenCount": 56,"totalTokenCount": 172,"promptTokensDetails": [{"modality": '
        r'"TEXT","tokenCount": 21}],"thoughtsTokenCount": 95},"modelVersion": "gemini-2.5-flash",'
        r'"responseId": "RUy4aObyJcTujrEPqtKYKQ"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"executableCode": {"language": "PYTHON","code": '
        r'"prime_numbers = [2, 3, 5, 7, 11]\nsum_of_primes = sum(prime_numbers)\nprint(f'
        r"'The sum of the first 5 prime numbers is: {sum_of_primes}')\n"
        r'"}}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 21,'
        r'"candidatesTokenCount": 112,'
        r'"totalTokenCount": 228,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 21}],'
        r'"thoughtsTokenCount": 95},"modelVersion": "gemini-2.5-flash","responseId": '
        r'"RUy4aObyJcTujrEPqtKYKQ"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"codeExecutionResult": {"outcome": "OUTCOME_OK",'
        r'"output": "The sum of the first 5 prime numbers is: 28\n"}}],"role": "model"},"index": '
        r'0}],"usageMetadata": {"promptTokenCount": 21,"candidatesTokenCount": 112,'
        r'"totalTokenCount": 228,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 21}],'
        r'"thoughtsTokenCount": 95},"modelVersion": "gemini-2.5-flash","responseId": '
        r'"RUy4aObyJcTujrEPqtKYKQ"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": "The sum of the"}],"role": "model"},'
        r'"index": 0}],"usageMetadata": {"promptTokenCount": 21,"candidatesTokenCount": 116,'
        r'"totalTokenCount": 475,"promptTokensDetails": [{"modality": "TEXT","tokenCount": 21}],'
        r'"toolUsePromptTokenCount": 243,"toolUsePromptTokensDetails": [{"modality": "TEXT",'
        r'"tokenCount": 243}],"thoughtsTokenCount": 95},"modelVersion": "gemini-2.5-flash",'
        r'"responseId": "RUy4aObyJcTujrEPqtKYKQ"}'
    ),
    ev(
        r'{"candidates": [{"content": {"parts": [{"text": " first 5 prime numbers is 28."}],'
        r'"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": '
        r'{"promptTokenCount": 21,"candidatesTokenCount": 126,"totalTokenCount": 485,'
        r'"promptTokensDetails": [{"modality": "TEXT","tokenCount": 21}],'
        r'"toolUsePromptTokenCount": 243,"toolUsePromptTokensDetails": [{"modality": "TEXT",'
        r'"tokenCount": 243}],"thoughtsTokenCount": 95},"modelVersion": "gemini-2.5-flash",'
        r'"responseId": "RUy4aObyJcTujrEPqtKYKQ"}'
    ),
]


def _image_event(text: str, tokens: int) -> bytes:
    return ev(
        '{"candidates": [{"content": {"parts": [{"text": "' + text + '"}],"role": "model"}}],'
        '"usageMetadata": {"promptTokenCount": 16,"candidatesTokenCount": ' + str(tokens) + ","
        '"totalTokenCount": ' + str(16 + tokens) + ',"promptTokensDetails": [{"modality": '
        '"TEXT","tokenCount": 16}]},"modelVersion": "gemini-2.5-flash-image-preview",'
        '"responseId": "kLewaKa5ONqI-8YP-c_NuAQ"}'
    )


# Firebase googleai/streaming-success-empty-parts.txt: a content with no parts mid-stream,
# then an image (inlineData) with the finish.
EMPTY_PARTS = [
    _image_event("Here's a", 4),
    _image_event(" cute cartoon kitten playing", 8),
    _image_event(" with a ball of", 12),
    _image_event(" yarn for", 14),
    _image_event(" you! ", 17),
    ev(
        '{"candidates": [{"content": {"role": "model"}}],"usageMetadata": {"promptTokenCount": '
        '16,"candidatesTokenCount": 17,"totalTokenCount": 33,"promptTokensDetails": '
        '[{"modality": "TEXT","tokenCount": 16}]},"modelVersion": '
        '"gemini-2.5-flash-image-preview","responseId": "kLewaKa5ONqI-8YP-c_NuAQ"}'
    ),
    ev(
        '{"candidates": [{"content": {"parts": [{"inlineData": {"mimeType": "image/png","data": '
        '"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVQImWNwav0CAALIAbzDqqRyAAAAAElFTkSu'
        'QmCC"}}],"role": "model"},"finishReason": "STOP"}],"usageMetadata": {"promptTokenCount": '
        '16,"candidatesTokenCount": 1307,"totalTokenCount": 1323,"promptTokensDetails": '
        '[{"modality": "TEXT","tokenCount": 16}],"candidatesTokensDetails": [{"modality": '
        '"IMAGE","tokenCount": 1290}]},"modelVersion": "gemini-2.5-flash-image-preview",'
        '"responseId": "kLewaKa5ONqI-8YP-c_NuAQ"}'
    ),
]


def _blocked_text(text: str) -> bytes:
    return ev(
        '{"candidates": [{"content": {"parts": [{"text": "' + text + '"}],"role": "model"}}],'
        '"usageMetadata": {"promptTokenCount": 7,"totalTokenCount": 7,"promptTokensDetails": '
        '[{"modality": "TEXT","tokenCount": 7}]},"modelVersion": "gemini-2.0-flash"}'
    )


BLOCK_FEEDBACK = (
    '{"blockReason": "SAFETY","safetyRatings": [{"category": "HARM_CATEGORY_SEXUALLY_EXPLICIT",'
    '"probability": "NEGLIGIBLE"},{"category": "HARM_CATEGORY_HATE_SPEECH","probability": '
    '"HIGH"},{"category": "HARM_CATEGORY_HARASSMENT","probability": "NEGLIGIBLE"},{"category": '
    '"HARM_CATEGORY_DANGEROUS_CONTENT","probability": "NEGLIGIBLE"}]}'
)
# Firebase googleai/streaming-failure-prompt-blocked-safety.txt: three text events, then the
# block. The file ends its last event with a single LF, no blank line: a WHATWG decoder (ours)
# never dispatches it (google-genai's reader would); BLOCKED_WHOLE restores the blank line.
BLOCKED = [_blocked_text("text1"), _blocked_text("text2"), _blocked_text("text3")]
BLOCK_EVENT = ev('{"promptFeedback": ' + BLOCK_FEEDBACK + "}")
BLOCKED_TAIL = BLOCK_EVENT[:-1]
# A prompt blocked before any candidate: the API reference's documented case ("promptFeedback
# ... only sent in the first stream chunk and only happens if no candidates were generated"),
# built from the same captured feedback.
BLOCKED_FIRST = ev(
    '{"promptFeedback": ' + BLOCK_FEEDBACK + ',"usageMetadata": {"promptTokenCount": 7,'
    '"totalTokenCount": 7},"modelVersion": "gemini-2.0-flash"}'
)
BLOCKED_USAGE = Usage(input_tokens=7)

# python-genai test_async_stream.py EVENT_STREAM_DATA_WITH_ERROR (there as raw JSON lines).
GENAI_TEXT = ev('{"candidates":[{"content":{"parts":[{"text":"test"}],"role":"model"}}]}')
GENAI_ERROR = ev('{"error":{"code":500,"message":"Error","status":"INTERNAL"}}')
# caugner/gemdn EXAMPLE_ERROR: the API's own overload error.
OVERLOADED = ev(
    '{"error": {"code": 503, "message": "The model is overloaded. Please try again later.", '
    '"status": "UNAVAILABLE"}}'
)

_RATINGS = [
    {"category": f"HARM_CATEGORY_{name}", "probability": "NEGLIGIBLE"}
    for name in ("SEXUALLY_EXPLICIT", "HATE_SPEECH", "HARASSMENT", "DANGEROUS_CONTENT")
]


def _legacy(text: str) -> bytes:
    candidate = {
        "content": {"parts": [{"text": text}], "role": "model"},
        "finishReason": "STOP",
        "index": 0,
        "safetyRatings": _RATINGS,
    }
    return obj_ev({"candidates": [candidate]})


# caugner/gemdn EXAMPLE_RESPONSE, its first two elements: gemini-pro (1.0, since retired) put
# finishReason STOP on every chunk. Later models send it once, on the last chunk (all the
# captures above), and that is the contract judged here.
LEGACY = [_legacy("In the quaint, cobbled"), _legacy(" streets of Willow Creek")]
