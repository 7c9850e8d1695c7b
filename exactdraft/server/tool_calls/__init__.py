"""Tool calls in the server: the call formats a chat template speaks (`formats`), the readers
that parse each format's calls as they stream (`readers`), a request's tools and history
(`requests`) and the reply's calls in each API's shape (`replies`).

Invariant: a reply carries exactly the calls the committed text holds, parsed by the format the
model's template names.
"""
