"""SigV4: the upstream signature the gateway makes, and the client signatures it checks.

Both are botocore's signer; what is ours is which headers are signed and
sent, and what a client's signature must cover. The references here are
botocore's own: a request botocore signs for a client verifies, and the
gateway's signature verifies over exactly the headers, URL and body sent.
"""

from __future__ import annotations

import datetime
import hashlib

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.protocols.sigv4 import AwsKeys, Signer, parse_authorization, verify
from gateway.settings import ISSUED_AWS_KEYS, load_settings

URL = "https://bedrock-runtime.us-east-1.amazonaws.com/model/m%3A0/converse-stream"
BODY = b'{"messages":[]}'
KEYS = AwsKeys("AKIAEXAMPLE000000001", "secret-one")


def _signed_by_botocore(keys: AwsKeys, url: str, body: bytes) -> list[tuple[bytes, bytes]]:
    request = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={"Content-Type": "application/json", "Host": url.split("/")[2]},
    )
    SigV4Auth(
        Credentials(keys.access_key_id, keys.secret_access_key), "bedrock", "us-east-1"
    ).add_auth(request)
    return [(k.lower().encode(), str(v).encode()) for k, v in request.headers.items()]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def test_the_gateway_signature_verifies_over_what_it_sends() -> None:
    client_headers = [
        (b"content-type", b"application/json"),
        (b"authorization", b"AWS4-HMAC-SHA256 Credential=CLIENT/x/y/z/aws4_request, Signature=1"),
        (b"x-amz-date", b"20200101T000000Z"),
        (b"x-request-id", b"rid"),
    ]
    signer = Signer(AwsKeys("AKIAUPSTREAM00000001", "upstream-secret"), "us-east-1", "bedrock")
    headers = signer.sign("POST", URL, client_headers, BODY)
    names = [k for k, _ in headers]
    assert names.count(b"authorization") == 1
    assert names.count(b"x-amz-date") == 1
    assert (b"x-request-id", b"rid") in headers  # unsigned headers go along
    auth = dict(headers)[b"authorization"].decode()
    parts = parse_authorization(auth)
    assert parts is not None
    assert parts["access_key_id"] == "AKIAUPSTREAM00000001"
    assert (parts["region"], parts["service"]) == ("us-east-1", "bedrock")
    sent = [*headers, (b"host", b"bedrock-runtime.us-east-1.amazonaws.com")]
    assert verify("upstream-secret", "POST", URL, sent, BODY, now=_now())
    assert not verify("upstream-secret", "POST", URL, sent, BODY + b" ", now=_now())
    assert not verify("another-secret", "POST", URL, sent, BODY, now=_now())


def test_a_session_token_is_sent_and_signed() -> None:
    signer = Signer(AwsKeys("AKIAUPSTREAM00000001", "s", "token-1"), "eu-west-1", "bedrock")
    headers = dict(signer.sign("POST", URL, [(b"content-type", b"application/json")], BODY))
    assert headers[b"x-amz-security-token"] == b"token-1"
    assert b"x-amz-security-token" in headers[b"authorization"]


def test_a_client_signature_by_botocore_verifies_only_with_its_secret() -> None:
    url = "http://127.0.0.1:8080/bedrock/model/m%3A0/converse"
    headers = _signed_by_botocore(KEYS, url, BODY)
    assert verify(KEYS.secret_access_key, "POST", url, headers, BODY, now=_now())
    assert not verify("wrong", "POST", url, headers, BODY, now=_now())
    assert not verify(KEYS.secret_access_key, "POST", url, headers, b"{}", now=_now())
    assert not verify(KEYS.secret_access_key, "PUT", url, headers, BODY, now=_now())
    later = _now() + datetime.timedelta(minutes=10)
    assert not verify(KEYS.secret_access_key, "POST", url, headers, BODY, now=later)


def test_a_declared_payload_hash_must_be_the_bodys() -> None:
    url = "http://127.0.0.1:8080/model/m/converse"
    request = AWSRequest(
        method="POST",
        url=url,
        data=BODY,
        headers={"Host": "127.0.0.1:8080", "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"},
    )
    SigV4Auth(
        Credentials(KEYS.access_key_id, KEYS.secret_access_key), "bedrock", "us-east-1"
    ).add_auth(request)
    headers = [(k.lower().encode(), str(v).encode()) for k, v in request.headers.items()]
    assert not verify(KEYS.secret_access_key, "POST", url, headers, BODY, now=_now())
    assert hashlib.sha256(BODY).hexdigest() != "UNSIGNED-PAYLOAD"


@pytest.mark.parametrize(
    "value",
    [
        "Bearer abc",
        "AWS4-HMAC-SHA256 Credential=AKID/20200101/us-east-1/bedrock, Signature=x",
        "AWS4-HMAC-SHA256 Credential=AKID/20200101/us-east-1/bedrock/aws4_request",
    ],
)
def test_what_is_not_a_sigv4_authorization(value: str) -> None:
    assert parse_authorization(value) is None


def test_the_aws_keys_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UP_ID", "AKIAUP")
    monkeypatch.setenv("UP_SECRET", "up-secret")
    monkeypatch.setenv("TEAM_SECRET", "team-secret")
    route = (
        '[{"name": "b", "prefix": "/b", "upstream": "http://127.0.0.1:9", "protocol": "bedrock",'
        ' "aws": {"region": "us-east-1", "access_key_id_env": "UP_ID",'
        ' "secret_access_key_env": "UP_SECRET"}}]'
    )
    clients = (
        '[{"name": "t", "key_sha256": ["' + "a" * 64 + '"], "aws_keys": '
        '[{"access_key_id": "AKIATEAM000000000001", "secret_access_key_env": "TEAM_SECRET"}]}]'
    )
    monkeypatch.setenv("GATEWAY_ROUTES", route)
    monkeypatch.setenv("GATEWAY_CLIENTS", clients)
    settings = load_settings()
    packed = settings.credentials["b"]["b"].get_secret_value()
    assert AwsKeys.unpack(packed) == AwsKeys("AKIAUP", "up-secret")
    issued = settings.credentials[ISSUED_AWS_KEYS]["AKIATEAM000000000001"]
    assert issued.get_secret_value() == "team-secret"
    monkeypatch.delenv("UP_SECRET")
    with pytest.raises(ValueError, match="UP_SECRET"):
        load_settings()


def test_aws_keys_only_on_a_route_whose_protocol_signs() -> None:
    from pydantic import ValidationError

    from gateway.settings import RouteConfig

    aws = {"region": "us-east-1"}
    assert RouteConfig(upstream="http://u.test", protocol="bedrock", aws=aws).aws is not None
    assert RouteConfig(upstream="http://u.test", aws=aws).aws is not None  # auto
    with pytest.raises(ValidationError, match="not signed"):
        RouteConfig(upstream="http://u.test/v1", protocol="chat", aws=aws)
    with pytest.raises(ValidationError, match="not both"):
        RouteConfig(upstream="http://u.test", protocol="bedrock", aws=aws, credential_env="K")


def test_a_bedrock_stream_is_never_continued() -> None:
    from pydantic import ValidationError

    from gateway.protocols import spec_for
    from gateway.settings import RouteConfig

    assert spec_for("bedrock").continuable is False
    with pytest.raises(ValidationError, match="never continued"):
        RouteConfig(upstream="http://u.test", protocol="bedrock", continue_after_cut=True)
