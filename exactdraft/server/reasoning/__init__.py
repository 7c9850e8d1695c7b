"""Reasoning in the server: the reasoning formats a chat template speaks (`formats`), the
splitters that part a model's text into its reasoning and its answer as it streams (`formats`
for think tags, `harmony` for Harmony's channels) and the pieces they emit, with the Splitter
base they share (`pieces`). Each API
module shapes the pieces: OpenAI's `reasoning_content`, the Responses API's `reasoning` items,
Anthropic's `thinking` blocks.

Invariant: the split reads the committed text only; it never changes what is generated.
"""
