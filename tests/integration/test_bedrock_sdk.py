"""AWS Bedrock Runtime end to end: boto3 and anthropic's AnthropicBedrock through a real gateway.

The gateway fronts the simulator's Bedrock Runtime with the documented route
(``protocol = "bedrock"``, the upstream's own AWS keys in ``aws``), and the
clients point ``endpoint_url`` at it, authenticating with a gateway key as
botocore sends ``AWS_BEARER_TOKEN_BEDROCK`` (``Authorization: Bearer``). A
complete ConverseStream or InvokeModelWithResponseStream reads exactly as
from the simulator directly; each fault makes the client raise with the
gateway's reason, where without the gateway botocore ends a cut stream
silently. The upstream request is signed (SigV4) with the route's keys; the
client's key never reaches it. Usage feeds the metrics and the access log.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import EventStreamError

from gateway.protocols.sigv4 import AwsKeys, verify
from gateway.settings import ISSUED_AWS_KEYS
from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import access_log_line, gateway_for, metric_value
from tests.integration.raw_upstream import chunk, raw_upstream
from tests.sdk import anthropic
from tests.unit.bedrock_streams import CONVERSE_TEXT

pytestmark = pytest.mark.timeout(120)

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
KEY = "gateway-key-for-bedrock"
UPSTREAM_KEYS = AwsKeys("AKIDSIMULATOR", "simulator-secret")
#: Keys a client signs with that the gateway never issued (dropped with a gateway key).
CLIENT_OWN = AwsKeys("AKIACLIENTOWNKEY0001", "client-own-secret")
#: A key pair the gateway issued to team-a: its SigV4 requests are team-a's.
ISSUED = AwsKeys("AKIAGATEWAYTEAMA0001", "team-a-issued-secret")
MESSAGES = [{"role": "user", "content": [{"text": "hi"}]}]
INVOKE_BODY = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hi"}],
}
#: Each fault, and the reason the client raises with.
FAULTS = {
    "drop_mid_event": "missing_done",  # a frame cut in its middle, then a clean end
    "drop_after_text": "missing_done",  # cut between frames
    "invalid_shape": "invalid_shape",
    "done_without_finish": "missing_finish",
    "drop_before_done": "missing_done",
    "stall_mid_stream": "idle_timeout",
    "abort_mid_body": "upstream_disconnect",
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    route = {
        "name": "bedrock",
        "prefix": "/bedrock",
        "upstream": simulator.url,
        "protocol": "bedrock",
        "aws": {"region": "us-east-1"},
        "timeouts": {"idle": 2.0},
    }
    credentials = {
        "bedrock": {"bedrock": UPSTREAM_KEYS.packed()},
        ISSUED_AWS_KEYS: {ISSUED.access_key_id: ISSUED.secret_access_key},
    }
    issued = {"access_key_id": ISSUED.access_key_id, "secret_access_key_env": "TEAM_A_SECRET"}
    clients = [{"name": "team-a", "key_sha256": [_sha(KEY)], "aws_keys": [issued]}]
    return {"routes": [route], "credentials": credentials, "clients": clients, "access_log": True}


def _client(
    url: str,
    fault: str | None = None,
    *,
    key: str | None = None,
    aws: AwsKeys = CLIENT_OWN,
    sent: list[dict[str, str]] | None = None,
) -> Any:
    """A bedrock-runtime client; with ``key``, it authenticates as botocore does with
    ``AWS_BEARER_TOKEN_BEDROCK`` (``Authorization: Bearer``), which botocore itself sends
    only over HTTPS: the hook puts it in the place of the signature on this loopback."""
    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=aws.access_key_id,
        aws_secret_access_key=aws.secret_access_key,
        config=Config(retries={"max_attempts": 1}, read_timeout=30),
    )

    def headers(request: Any, **kwargs: Any) -> None:
        request.headers["x-sim-tps"] = "0"
        if key is not None:
            request.headers["Authorization"] = f"Bearer {key}"
        if fault is not None:
            request.headers["x-sim-fault"] = fault
            request.headers["x-sim-stall-seconds"] = "30"
        if sent is not None:
            sent.append(
                {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
            )

    # After signing: a header set here is not part of the signature (nor needs to be).
    client.meta.events.register("before-send.bedrock-runtime.*", headers)
    return client


def _converse_text(client: Any) -> tuple[str, dict[str, Any]]:
    response = client.converse_stream(modelId=MODEL, messages=MESSAGES)
    text, last = "", {}
    for event in response["stream"]:
        if "contentBlockDelta" in event:
            text += event["contentBlockDelta"]["delta"].get("text", "")
        last = event
    return text, last


def _invoke_text(client: Any) -> str:
    response = client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(INVOKE_BODY))
    text = ""
    for event in response["body"]:
        inner = json.loads(event["chunk"]["bytes"])
        if inner["type"] == "content_block_delta":
            text += inner["delta"]["text"]
    return text


def test_a_complete_converse_stream_reads_as_from_the_simulator(
    gateway: ServerThread, simulator: ServerThread
) -> None:
    direct_text, direct_last = _converse_text(_client(simulator.url))
    text, last = _converse_text(_client(gateway.url + "/bedrock", key=KEY))
    assert text == direct_text
    assert text
    assert last == direct_last
    assert last["metadata"]["usage"]["outputTokens"] == 20


def test_a_complete_invoke_stream_reads_as_from_the_simulator(
    gateway: ServerThread, simulator: ServerThread
) -> None:
    direct = _invoke_text(_client(simulator.url))
    assert _invoke_text(_client(gateway.url + "/bedrock", key=KEY)) == direct


def test_the_gateway_streams_are_counted_with_their_usage(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    client = _client(gateway.url + "/bedrock", key=KEY)
    response = client.converse_stream(modelId=MODEL, messages=MESSAGES)
    request_id = response["ResponseMetadata"]["HTTPHeaders"]["x-request-id"]
    list(response["stream"])
    line = access_log_line(capsys, request_id)
    assert line["outcome"] == "complete"
    assert line["reason"] == "stop"
    assert line["client_name"] == "team-a"
    assert line["charged"] == {"input": 15, "output": 20, "source": "reported"}
    assert line["usage"]["output"] == 20
    assert line["model"] == MODEL
    assert line["upstream_request_id"].startswith("req_sim_")  # Bedrock's x-amzn-requestid
    metrics = web.get(gateway.url + "/metrics").text
    tokens = metric_value(
        metrics, "gateway_tokens_total", route="bedrock", type="output", client="team-a"
    )
    assert tokens >= 20
    assert (
        metric_value(
            metrics, "gateway_streams_total", route="bedrock", outcome="complete", reason="stop"
        )
        >= 1
    )


@pytest.mark.parametrize(("fault", "reason"), sorted(FAULTS.items()))
def test_each_fault_makes_boto3_raise_with_the_reason(
    gateway: ServerThread, fault: str, reason: str
) -> None:
    client = _client(gateway.url + "/bedrock", fault, key=KEY)
    with pytest.raises(EventStreamError) as raised:
        _converse_text(client)
    assert raised.value.response["Error"]["Code"] == "modelStreamErrorException"
    assert f"({reason})" in str(raised.value)
    with pytest.raises(EventStreamError) as raised_invoke:
        _invoke_text(client)
    assert f"({reason})" in str(raised_invoke.value)


@pytest.mark.parametrize("fault", ["drop_mid_event", "drop_after_text", "drop_before_done"])
def test_without_the_gateway_boto3_ends_a_cut_stream_silently(
    simulator: ServerThread, fault: str
) -> None:
    """The problem the gateway solves: the same faults, straight from the simulator."""
    whole, _ = _converse_text(_client(simulator.url))
    text, last = _converse_text(_client(simulator.url, fault))  # no exception
    assert text != whole or "metadata" not in last  # half an answer, taken for a whole one


def test_the_upstreams_own_exception_frame_is_forwarded(gateway: ServerThread) -> None:
    with pytest.raises(EventStreamError) as raised:
        _converse_text(_client(gateway.url + "/bedrock", "error_event", key=KEY))
    assert "The system encountered an unexpected error" in str(raised.value)
    assert "request_id" not in str(raised.value)  # the upstream's, not the gateway's


def test_a_whole_invoke_answer_is_relayed(gateway: ServerThread) -> None:
    answer = _client(gateway.url + "/bedrock", key=KEY).invoke_model(
        modelId=MODEL, body=json.dumps(INVOKE_BODY)
    )
    message = json.loads(answer["body"].read())
    assert message["type"] == "message"
    assert message["stop_reason"] == "end_turn"


def test_a_whole_converse_answer_is_relayed(gateway: ServerThread) -> None:
    answer = _client(gateway.url + "/bedrock", key=KEY).converse(modelId=MODEL, messages=MESSAGES)
    assert answer["stopReason"] == "end_turn"
    assert answer["usage"]["outputTokens"] == 20


def test_the_upstream_request_is_signed_with_the_routes_keys(
    gateway: ServerThread, simulator: ServerThread
) -> None:
    response = _client(gateway.url + "/bedrock", key=KEY).converse_stream(
        modelId=MODEL, messages=MESSAGES
    )
    request_id = response["ResponseMetadata"]["HTTPHeaders"]["x-request-id"]
    list(response["stream"])
    record = web.get(f"{simulator.url}/_sim/requests/{request_id}").json()
    headers = record["headers"]
    assert headers["authorization"]["sha256"] != _sha(f"Bearer {KEY}")
    assert headers["x-amz-date"]
    assert record["path"].startswith("/model/")


def test_a_client_without_a_gateway_key_is_refused_in_bedrocks_shape(
    gateway: ServerThread,
) -> None:
    from botocore.exceptions import ClientError

    client = _client(gateway.url + "/bedrock")  # SigV4 with keys the gateway never issued
    with pytest.raises(ClientError) as raised:
        client.converse(modelId=MODEL, messages=MESSAGES)
    assert raised.value.response["Error"]["Code"] == "AccessDeniedException"
    assert "request_id=" in raised.value.response["Error"]["Message"]


def test_anthropic_bedrock_reads_a_complete_stream_and_raises_on_a_cut(
    gateway: ServerThread, simulator: ServerThread
) -> None:
    def client(fault: str | None) -> Any:
        headers = {"x-sim-tps": "0"}
        if fault:
            headers["x-sim-fault"] = fault
        return anthropic.AnthropicBedrock(
            aws_region="us-east-1",
            api_key=KEY,  # AWS_BEARER_TOKEN_BEDROCK: Authorization: Bearer
            base_url=gateway.url + "/bedrock",
            default_headers=headers,
            max_retries=0,
        )

    with client(None).messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
    assert text
    for fault, reason in FAULTS.items():
        with (
            pytest.raises(anthropic.APIError) as raised,
            client(fault).messages.stream(
                model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
            ) as stream,
        ):
            "".join(stream.text_stream)
        assert f"({reason})" in str(raised.value), fault


def test_a_client_signing_with_an_issued_key_pair_is_that_client(
    gateway: ServerThread, simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    sent: list[dict[str, str]] = []
    client = _client(gateway.url + "/bedrock", aws=ISSUED, sent=sent)
    response = client.converse_stream(modelId=MODEL, messages=MESSAGES)
    request_id = response["ResponseMetadata"]["HTTPHeaders"]["x-request-id"]
    text = "".join(
        e["contentBlockDelta"]["delta"]["text"]
        for e in response["stream"]
        if "contentBlockDelta" in e
    )
    assert text
    assert access_log_line(capsys, request_id)["client_name"] == "team-a"
    # Verified, never forwarded: the upstream got the route's own signature.
    client_auth = sent[-1]["Authorization"]
    assert client_auth.startswith(f"AWS4-HMAC-SHA256 Credential={ISSUED.access_key_id}/")
    upstream = web.get(f"{simulator.url}/_sim/requests/{request_id}").json()["headers"]
    assert upstream["authorization"]["sha256"] != _sha(client_auth)


def test_a_signature_with_a_wrong_secret_or_an_unknown_key_is_refused(
    gateway: ServerThread,
) -> None:
    from botocore.exceptions import ClientError

    for keys in (
        AwsKeys(ISSUED.access_key_id, "not-the-secret"),
        AwsKeys("AKIAUNKNOWN000000001", "x"),
    ):
        with pytest.raises(ClientError) as raised:
            _client(gateway.url + "/bedrock", aws=keys).converse(modelId=MODEL, messages=MESSAGES)
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401
        assert raised.value.response["Error"]["Code"] == "AccessDeniedException"


def test_the_upstream_signature_verifies_over_what_the_upstream_received() -> None:
    """The gateway signs what it sends: the raw request (its Host, its path with the
    model id's quoting, its body) verifies with the route's secret, and only with it."""
    frames = b"".join(CONVERSE_TEXT)

    async def respond(request: Any, reader: Any, writer: Any) -> None:
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.amazon.eventstream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        writer.write(head + chunk(frames) + b"0\r\n\r\n")
        await writer.drain()

    with raw_upstream(respond) as upstream:
        route = {
            "name": "signed",
            "prefix": "/signed",
            "upstream": upstream.url,
            "protocol": "bedrock",
            "aws": {"region": "eu-west-1"},
        }
        credentials = {"signed": {"signed": UPSTREAM_KEYS.packed()}}
        with gateway_for("", routes=[route], credentials=credentials) as gw:
            client = _client(gw.url + "/signed")
            text, last = _converse_text(client)
    assert text == "Hello, world"
    assert "metadata" in last
    (received,) = upstream.requests
    method, target, _ = received.request_line.decode().split(" ")
    url = upstream.url + target
    now = datetime.datetime.now(datetime.UTC)
    assert "%3A" in target  # the model id's ":" as botocore quoted it, signed as sent
    assert verify(
        UPSTREAM_KEYS.secret_access_key, method, url, received.headers, received.body, now=now
    )
    assert not verify("another", method, url, received.headers, received.body, now=now)
    (auth,) = received.header_values(b"authorization")
    assert b"Credential=AKIDSIMULATOR/" in auth
    assert b"/eu-west-1/bedrock/aws4_request" in auth


def test_a_frame_over_the_event_limit_makes_boto3_raise_limit_exceeded(
    simulator: ServerThread,
) -> None:
    route = {"name": "small", "prefix": "/small", "upstream": simulator.url, "protocol": "bedrock"}
    with gateway_for("", routes=[route], limits={"max_event_bytes": 65536}) as gw:
        client = _client(gw.url + "/small", "huge_event")

        def bigger(request: Any, **kwargs: Any) -> None:
            request.headers["x-sim-chunk-bytes"] = "100000"

        client.meta.events.register("before-send.bedrock-runtime.*", bigger)
        with pytest.raises(EventStreamError) as raised:
            _converse_text(client)
    assert "(limit_exceeded)" in str(raised.value)


def _frames(body: bytes) -> list[bytes]:
    """An AWS event stream cut into its frames by their prelude's total length."""
    frames, pos = [], 0
    while pos + 4 <= len(body):
        size = int.from_bytes(body[pos : pos + 4], "big")
        frames.append(body[pos : pos + size])
        pos += size
    return frames


def test_a_bedrock_stream_resumes_byte_for_byte_from_a_frame_cursor(
    simulator: ServerThread,
) -> None:
    """A binary framing's events are whole frames, handed out by the guard as any
    framing's: a Bedrock stream on a route with resume is logged, and a resume from
    any count of frames gets exactly the rest of what the stream sent."""
    route = {
        "name": "bedrock",
        "prefix": "/bedrock",
        "upstream": simulator.url,
        "protocol": "bedrock",
        "aws": {"region": "us-east-1"},
        "resume": True,
    }
    credentials = {"bedrock": {"bedrock": UPSTREAM_KEYS.packed()}}
    with gateway_for("", routes=[route], credentials=credentials) as gw:
        text, last = _converse_text(_client(gw.url + "/bedrock"))
        response = web.post(
            gw.url + f"/bedrock/model/{MODEL}/converse-stream",
            json={"messages": MESSAGES},
            headers={"x-sim-tps": "0"},
        )
        assert response.status_code == 200
        stream_id = response.headers["x-gateway-stream-id"]
        frames = _frames(response.content)
        resumed = [
            web.get(gw.url + f"/bedrock/gateway/streams/{stream_id}?starting_after={k}")
            for k in (0, 3, len(frames))
        ]
    assert text
    assert last["metadata"]["usage"]["outputTokens"] == 20  # read whole by boto3
    assert len(frames) > 3
    assert b"".join(frames) == response.content
    for k, again in zip((0, 3, len(frames)), resumed, strict=True):
        assert again.status_code == 200
        assert again.content == b"".join(frames[k:])


def _signed_converse(url: str, region: str, service: str) -> Any:
    """A Converse request signed with the issued key pair for ``region`` and ``service``."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    body = json.dumps({"messages": MESSAGES}).encode()
    target = f"{url}/bedrock/model/{MODEL}/converse"
    request = AWSRequest(
        method="POST", url=target, data=body, headers={"content-type": "application/json"}
    )
    credentials = Credentials(ISSUED.access_key_id, ISSUED.secret_access_key)
    SigV4Auth(credentials, service, region).add_auth(request)
    return web.post(target, content=body, headers=dict(request.headers.items()))


def test_a_signature_scoped_to_another_region_or_service_is_refused(
    gateway: ServerThread,
) -> None:
    """Issue 45 item 7: a signature for ``eu-west-9`` or for ``s3`` verified all the same;
    its scope is the route's region (its upstreams') and the protocol's service."""
    assert _signed_converse(gateway.url, "us-east-1", "bedrock").status_code == 200
    for region, service in (("eu-west-9", "bedrock"), ("us-east-1", "s3")):
        refused = _signed_converse(gateway.url, region, service)
        assert refused.status_code == 401, refused.text
        message = refused.json()["message"]
        assert f"{region}/{service}" in message
        assert "us-east-1/bedrock" in message


def test_a_bedrock_stream_is_cached_and_replayed_byte_for_byte(simulator: ServerThread) -> None:
    """The cache's entry holds the guard's whole events, frames for a binary framing: a
    second identical Bedrock stream is a hit, the same bytes frame for frame."""
    route = {
        "name": "bedrock",
        "prefix": "/bedrock",
        "upstream": simulator.url,
        "protocol": "bedrock",
        "aws": {"region": "us-east-1"},
        "cache": True,
    }
    credentials = {"bedrock": {"bedrock": UPSTREAM_KEYS.packed()}}
    url = f"/bedrock/model/{MODEL}/converse-stream"
    body = {"messages": MESSAGES}
    with gateway_for("", routes=[route], credentials=credentials) as gw:
        first = web.post(gw.url + url, json=body, headers={"x-sim-tps": "0"})
        again = web.post(gw.url + url, json=body, headers={"x-sim-tps": "0"})
    assert first.status_code == again.status_code == 200
    assert first.headers["x-gateway-cache"] == "MISS"
    assert again.headers["x-gateway-cache"] == "HIT"
    frames = _frames(first.content)
    assert len(frames) > 3
    assert _frames(again.content) == frames
    assert again.content == first.content
