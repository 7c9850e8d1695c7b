"""Reasoning in the server: the reasoning formats a chat template speaks and the splitters that
part a model's text into its reasoning and its answer as it streams (`formats`, `harmony`),
and each API's shape for the reasoning (`anthropic_blocks`).

Invariant: the split reads the committed text only; it never changes what is generated.
"""
