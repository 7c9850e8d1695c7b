"""The clients people point at a local server, with their default settings, against the bundled
SmolLM2: instructor's TOOLS mode validates its model, a LangChain tool loop and the OpenAI Agents
SDK's chat-completions model run their loops to a final answer. Each client is installed from
its registry (the `integrations` extra pins them); a client that is not installed skips."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.conftest import needs_smollm2

pytestmark = [pytest.mark.slow, needs_smollm2]
QUESTION = "What is the weather in Paris?"


def weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"rainy, 12 C in {city}"


def test_instructor_tools_mode_validates_its_model(smollm2_server):
    instructor = pytest.importorskip("instructor")
    pydantic = pytest.importorskip("pydantic")
    base, _ = smollm2_server

    class City(pydantic.BaseModel):
        name: str
        country: str

    client = instructor.from_openai(
        openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0),
        mode=instructor.Mode.TOOLS)
    city = client.chat.completions.create(
        model="smollm2", response_model=City, max_tokens=200, temperature=0,
        messages=[{"role": "user", "content": "Paris is the capital of France. Extract the "
                                              "city and its country."}])
    assert isinstance(city, City) and city.name and city.country


def test_a_langchain_tool_loop_completes(smollm2_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    messages_module = pytest.importorskip("langchain_core.messages")
    tools_module = pytest.importorskip("langchain_core.tools")
    base, _ = smollm2_server
    tool = tools_module.tool(weather)
    model = langchain_openai.ChatOpenAI(model="smollm2", base_url=base + "/v1",
                                        api_key="unused", temperature=0, max_tokens=200,
                                        max_retries=0)
    history = [messages_module.HumanMessage(QUESTION)]
    first = model.bind_tools([tool], tool_choice="weather").invoke(history)
    (call,) = first.tool_calls
    assert call["name"] == "weather" and call["args"]["city"] == "Paris"
    history += [first, messages_module.ToolMessage(tool.invoke(call["args"]),
                                                   tool_call_id=call["id"])]
    final = model.bind_tools([tool]).invoke(history)
    # The reply is the model's own (this small model may echo the result's markup as text);
    # what the server guarantees is that no call markup is left in it.
    assert isinstance(final.content, str) and (final.content or final.tool_calls)
    assert "<tool_call>" not in final.content


def test_the_agents_sdk_chat_completions_model_runs_its_loop(smollm2_server):
    agents = pytest.importorskip("agents")
    base, _ = smollm2_server
    agents.set_tracing_disabled(True)
    called = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return weather(city)

    async def run():
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        settings = agents.ModelSettings(temperature=0, max_tokens=200, tool_choice="required")
        agent = agents.Agent(name="weather", instructions="Answer questions about the weather.",
                             tools=[get_weather], model_settings=settings,
                             model=agents.OpenAIChatCompletionsModel("smollm2", client))
        return await agents.Runner.run(agent, QUESTION)

    result = asyncio.run(run())
    assert called == ["Paris"]
    assert isinstance(result.final_output, str) and result.final_output
