"""Grammars and JSON schemas, compiled to GBNF and checked before any model work.

`compile` is the entry point (`resolve_grammar`: a request's grammar or JSON schema,
checked, as llama.cpp will take it); `gbnf_scan` and `gbnf_graph` measure a grammar
against the bounds in `grammar_limits`; `schema_limits` bounds a schema before
`schema_converter` turns it into a grammar. The decode loop (service.decode) only
runs what comes out of here.
"""
