"""Node result caches (LangGraph's ``langgraph.cache``): ``compile(cache=...)`` with a node's
``cache_policy`` reuses the writes of an earlier task of that node with the same input."""
