"""The sans-IO core: bytes in, events and a verdict out.

Nothing in this package does I/O, reads a clock or imports the rest of the
gateway. A framing's decoder (``sse``, ``ndjson``, ``eventstream``) decodes the
stream, one contract per protocol family judges it, ``StreamGuard`` decides which
bytes may be forwarded (and hands the stream's readers each whole event:
``whole``), and ``annotation`` renders the trailer that tells the client the truth.
"""

from gateway.guard.annotation import render_annotation
from gateway.guard.bedrock import BedrockContract
from gateway.guard.chat import ChatContract, CompletionsContract
from gateway.guard.contract import Action, Contract, FramingOnly, Protocol
from gateway.guard.decoder import Decoder
from gateway.guard.errors import BudgetExceeded, EventTooLarge, GuardError, LineTooLong
from gateway.guard.framing import Framing
from gateway.guard.gemini import GeminiContract, gemini_error_event
from gateway.guard.messages import MessagesContract
from gateway.guard.ndjson import NDJSONDecoder
from gateway.guard.ollama import OllamaContract
from gateway.guard.responses import ResponsesContract
from gateway.guard.sse import Event, SSEDecoder
from gateway.guard.stream import StreamGuard
from gateway.guard.verdict import Outcome, Reason, Usage, Verdict, normalize_finish
from gateway.guard.whole import EventConsumer, Refusal, WholeEvents

__all__ = [
    "Action",
    "BedrockContract",
    "BudgetExceeded",
    "ChatContract",
    "CompletionsContract",
    "Contract",
    "Decoder",
    "Event",
    "EventConsumer",
    "EventTooLarge",
    "Framing",
    "FramingOnly",
    "GeminiContract",
    "GuardError",
    "LineTooLong",
    "MessagesContract",
    "NDJSONDecoder",
    "OllamaContract",
    "Outcome",
    "Protocol",
    "Reason",
    "Refusal",
    "ResponsesContract",
    "SSEDecoder",
    "StreamGuard",
    "Usage",
    "Verdict",
    "WholeEvents",
    "gemini_error_event",
    "normalize_finish",
    "render_annotation",
]
