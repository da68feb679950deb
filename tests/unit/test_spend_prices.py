"""Golden prices: each protocol's reported usage, priced by the gateway, equals the
table's own price (genai-prices' calc_price) for the same usage, to a millionth of a
cent; and the evidence each kind of settlement carries."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import genai_prices
import pytest
from genai_prices import Usage as TableUsage
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import Protocol
from gateway.guard.bedrock import bedrock_usage
from gateway.guard.gemini import gemini_usage
from gateway.guard.usage import chat_usage, messages_usage, responses_usage
from gateway.guard.verdict import Usage
from gateway.money.charge import Evidence, price_cost
from gateway.money.prices import NANOS_PER_USD, Billable, Pricer
from gateway.policy.quota import Cost, Source, cost_of
from gateway.protocols import spec_for
from gateway.settings import PriceOverride

#: A millionth of a cent, in dollars.
TOLERANCE = Decimal("0.00000001")


def _charge(protocol: Protocol, model: str, usage: Usage, pricer: Pricer | None = None) -> int:
    spec = spec_for(protocol)
    pricer = pricer or Pricer()
    quote = pricer.quote(model, spec.price_provider)
    assert quote is not None, model
    cost = cost_of(usage.input_tokens, usage.output_tokens, 0, 0)
    charge = price_cost(cost, usage, True, False, spec.usage_basis, quote, model)
    assert charge.evidence is Evidence.REPORTED
    assert charge.table == f"genai-prices {genai_prices.__version__}"
    return charge.nanos


def _table(model: str, provider: str, **usage: int) -> Decimal:
    price = genai_prices.calc_price(TableUsage(**usage), model, provider_id=provider)
    return price.total_price


def _same(nanos: int, table: Decimal) -> None:
    assert abs(Decimal(nanos) / NANOS_PER_USD - table) < TOLERANCE, (nanos, table)
    assert table > 0


CHAT = [  # (model, prompt, cached, completion, reasoning)
    ("gpt-4o", 1000, 0, 500, 0),
    ("gpt-4o", 12000, 8192, 300, 0),
    ("gpt-4o-mini", 1, 0, 1, 0),
    ("gpt-4.1", 250000, 100000, 4000, 0),
    ("o3-mini", 2000, 1024, 9000, 8000),
    ("o1", 500, 0, 20000, 19000),
]


@pytest.mark.parametrize(("model", "prompt", "cached", "completion", "reasoning"), CHAT)
def test_chat_usage_is_priced_as_the_table_prices_it(
    model: str, prompt: int, cached: int, completion: int, reasoning: int
) -> None:
    usage = chat_usage(
        {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }
    )
    assert usage is not None
    nanos = _charge(Protocol.CHAT, model, usage)
    table = _table(
        model,
        "openai",
        input_tokens=prompt,
        cache_read_tokens=cached,
        output_tokens=completion,
        output_reasoning_tokens=reasoning,
    )
    _same(nanos, table)


RESPONSES = [
    ("gpt-4o", 3000, 0, 700, 0),
    ("gpt-4o", 3000, 2048, 700, 0),
    ("o4-mini", 4000, 0, 6000, 5000),
    ("gpt-4.1-mini", 90000, 45000, 1200, 0),
    ("gpt-5", 10000, 5000, 3000, 2000),
]


@pytest.mark.parametrize(("model", "prompt", "cached", "output", "reasoning"), RESPONSES)
def test_responses_usage_is_priced_as_the_table_prices_it(
    model: str, prompt: int, cached: int, output: int, reasoning: int
) -> None:
    usage = responses_usage(
        {
            "input_tokens": prompt,
            "output_tokens": output,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens_details": {"reasoning_tokens": reasoning},
        }
    )
    assert usage is not None
    nanos = _charge(Protocol.RESPONSES, model, usage)
    table = _table(
        model,
        "openai",
        input_tokens=prompt,
        cache_read_tokens=cached,
        output_tokens=output,
        output_reasoning_tokens=reasoning,
    )
    _same(nanos, table)


MESSAGES = [  # Anthropic's input excludes the cached tokens read and written
    ("claude-sonnet-4-5", 1000, 0, 0, 400),
    ("claude-sonnet-4-5", 20, 30000, 0, 400),
    ("claude-sonnet-4-5", 20, 0, 30000, 400),
    ("claude-3-5-haiku-latest", 5000, 2000, 1000, 800),
    ("claude-opus-4-1", 100, 50000, 2000, 1500),
    ("claude-sonnet-4-5", 150000, 60000, 0, 1000),  # over 200k in all: the long-context tier
]


@pytest.mark.parametrize(("model", "uncached", "read", "written", "output"), MESSAGES)
def test_messages_usage_with_cache_reads_and_writes_is_priced_as_the_table_prices_it(
    model: str, uncached: int, read: int, written: int, output: int
) -> None:
    usage = messages_usage(
        {
            "input_tokens": uncached,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
            "output_tokens": output,
        }
    )
    assert usage is not None
    nanos = _charge(Protocol.MESSAGES, model, usage)
    table = _table(
        model,
        "anthropic",
        input_tokens=uncached + read + written,
        cache_read_tokens=read,
        cache_write_tokens=written,
        output_tokens=output,
    )
    _same(nanos, table)


GEMINI = [  # Gemini's candidates exclude the thoughts; its prompt includes the cache
    ("gemini-2.5-flash", 1000, 0, 300, 0),
    ("gemini-2.5-flash", 1000, 600, 300, 1200),
    ("gemini-2.5-pro", 50000, 10000, 2000, 4000),
    ("gemini-2.5-pro", 250000, 0, 1000, 0),  # over 200k: the long-context tier
    ("gemini-2.0-flash", 800, 0, 100, 0),
]


@pytest.mark.parametrize(("model", "prompt", "cached", "candidates", "thoughts"), GEMINI)
def test_gemini_usage_is_priced_as_the_table_prices_it(
    model: str, prompt: int, cached: int, candidates: int, thoughts: int
) -> None:
    usage = gemini_usage(
        {
            "promptTokenCount": prompt,
            "cachedContentTokenCount": cached,
            "candidatesTokenCount": candidates,
            "thoughtsTokenCount": thoughts,
        }
    )
    assert usage is not None
    nanos = _charge(Protocol.GEMINI, model, usage)
    table = _table(
        model,
        "google",
        input_tokens=prompt,
        cache_read_tokens=cached,
        output_tokens=candidates + thoughts,
        output_reasoning_tokens=thoughts,
    )
    _same(nanos, table)


BEDROCK = [  # Converse's inputTokens excludes the cached tokens read and written
    ("anthropic.claude-3-5-sonnet-20240620-v1:0", 1000, 0, 0, 200),
    ("anthropic.claude-3-5-sonnet-20240620-v1:0", 10, 4000, 0, 200),
    ("anthropic.claude-3-5-sonnet-20240620-v1:0", 10, 0, 4000, 200),
    ("amazon.nova-pro-v1:0", 3000, 0, 0, 500),
    ("meta.llama3-70b-instruct-v1:0", 700, 0, 0, 300),
]


@pytest.mark.parametrize(("model", "uncached", "read", "written", "output"), BEDROCK)
def test_bedrock_converse_usage_is_priced_as_the_table_prices_it(
    model: str, uncached: int, read: int, written: int, output: int
) -> None:
    usage = bedrock_usage(
        {
            "inputTokens": uncached,
            "cacheReadInputTokens": read,
            "cacheWriteInputTokens": written,
            "outputTokens": output,
        }
    )
    assert usage is not None
    nanos = _charge(Protocol.BEDROCK, model, usage)
    table = _table(
        model,
        "aws",
        input_tokens=uncached + read + written,
        cache_read_tokens=read,
        cache_write_tokens=written,
        output_tokens=output,
    )
    _same(nanos, table)


SELF_HOSTED = [(100, 50), (123457, 98765), (1, 0)]


@pytest.mark.parametrize(("prompt", "output"), SELF_HOSTED)
def test_a_self_hosted_model_is_priced_by_its_override(prompt: int, output: int) -> None:
    override = PriceOverride(model="llama3.1:8b", input=Decimal("0.05"), output=Decimal("0.08"))
    pricer = Pricer([override])
    quote = pricer.quote("llama3.1:8b", spec_for(Protocol.OLLAMA).price_provider)
    assert quote is not None
    assert quote.table.startswith("override")
    usage = Usage(input_tokens=prompt, output_tokens=output)
    charge = price_cost(
        cost_of(prompt, output, 0, 0),
        usage,
        True,
        False,
        spec_for(Protocol.OLLAMA).usage_basis,
        quote,
        "llama3.1:8b",
    )
    expected = (Decimal(prompt) * Decimal("0.05") + Decimal(output) * Decimal("0.08")) / 10**6
    assert abs(Decimal(charge.nanos) / NANOS_PER_USD - expected) < TOLERANCE


def test_the_override_most_specific_wins_and_a_provider_override_uses_the_tables_prices() -> None:
    pricer = Pricer(
        [
            PriceOverride(model="*", input=Decimal("1"), output=Decimal("1")),
            PriceOverride(model="gpt-4o", client="acme", input=Decimal("2"), output=Decimal("3")),
            PriceOverride(model="gpt-4o", route="azure", provider="azure"),
        ]
    )
    usage = Usage(input_tokens=10**6, output_tokens=10**6)
    basis = spec_for(Protocol.CHAT).usage_basis
    cost = cost_of(10**6, 10**6, 0, 0)

    def nanos(**where: str) -> int:
        quote = pricer.quote("gpt-4o", "openai", **where)
        assert quote is not None
        return price_cost(cost, usage, True, False, basis, quote, "gpt-4o").nanos

    assert nanos(client="acme") == 5 * NANOS_PER_USD
    assert nanos(client="other") == 2 * NANOS_PER_USD
    table = genai_prices.calc_price(
        TableUsage(input_tokens=10**6, output_tokens=10**6), "gpt-4o", provider_id="azure"
    ).total_price
    assert Decimal(nanos(route="azure")) / NANOS_PER_USD == table


def test_a_model_nothing_prices_is_unpriced_and_charged_nothing() -> None:
    pricer = Pricer()
    assert pricer.quote("no-such-model-anywhere", "openai") is None
    charge = price_cost(
        Cost(100, 10, Source.REPORTED),
        Usage(100, 10),
        True,
        False,
        spec_for(Protocol.CHAT).usage_basis,
        None,
        "no-such-model-anywhere",
    )
    assert charge.evidence is Evidence.UNPRICED
    assert charge.nanos == 0


def test_the_evidence_of_an_estimate_a_partial_report_and_a_rescue() -> None:
    quote = Pricer().quote("gpt-4o", "openai")
    assert quote is not None
    basis = spec_for(Protocol.CHAT).usage_basis
    estimated = price_cost(cost_of(None, None, 100, 40), None, True, False, basis, quote, "m")
    assert estimated.evidence is Evidence.ESTIMATED
    assert estimated.nanos == quote.cost(estimated.usage) > 0  # a cut stream is never $0
    half = Usage(input_tokens=100)
    partial = price_cost(cost_of(100, None, 100, 40), half, True, False, basis, quote, "m")
    assert partial.evidence is Evidence.PARTIAL
    assert partial.usage.output == 40
    rescued = price_cost(cost_of(300, 90, 0, 0), Usage(300, 90), False, False, basis, quote, "m")
    assert rescued.evidence is Evidence.PARTIAL
    billed = price_cost(cost_of(None, None, 300, 90), None, True, True, basis, quote, "m")
    assert billed.evidence is Evidence.PARTIAL
    assert billed.nanos == rescued.nanos


def test_a_reservations_bound_is_never_below_the_charge() -> None:
    for model, provider in (("claude-sonnet-4-5", "anthropic"), ("gemini-2.5-pro", "google")):
        quote = Pricer().quote(model, provider)
        assert quote is not None
        usage = Usage(input_tokens=250000, output_tokens=5000, cache_write_tokens=0)
        basis = spec_for(Protocol.MESSAGES).usage_basis
        charge = price_cost(cost_of(250000, 5000, 0, 0), usage, True, False, basis, quote, model)
        assert quote.bound(250000, 5000) >= charge.nanos


MODELS = [
    ("gpt-4o", "openai"),
    ("o3-mini", "openai"),
    ("gpt-5", "openai"),
    ("claude-sonnet-4-5", "anthropic"),
    ("claude-opus-4-1", "anthropic"),
    ("gemini-2.5-pro", "google"),
    ("gemini-2.5-flash", "google"),
    ("anthropic.claude-3-5-sonnet-20240620-v1:0", "aws"),
    ("amazon.nova-pro-v1:0", "aws"),
]


@given(
    model=st.sampled_from(MODELS),
    uncached=st.integers(0, 400_000),
    read=st.integers(0, 300_000),
    written=st.integers(0, 100_000),
    answer=st.integers(0, 50_000),
    reasoning=st.integers(0, 50_000),
)
def test_the_integer_arithmetic_is_the_tables_own_to_the_nano_dollar(
    model: tuple[str, str], uncached: int, read: int, written: int, answer: int, reasoning: int
) -> None:
    """Where a model's prices are integers in pico-dollars, a charge is summed without
    Decimal: it is the table's own calc_price, rounded once, every time."""
    name, provider = model
    quote = Pricer().quote(name, provider)
    assert quote is not None
    assert quote.fast is not None
    usage = Billable(uncached + read + written, answer + reasoning, read, written, reasoning)
    table = genai_prices.calc_price(usage.as_table_usage(), name, provider_id=provider)
    expected = int((table.total_price * NANOS_PER_USD).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    assert quote.cost(usage) == expected
