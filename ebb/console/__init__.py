"""The web console: a static single-page app (`static/`) and the routes that serve it at
/console (`routes.py`), mounted by the frontdoor's app. The page calls the same /v1 API as
every other client, so nothing here reads Redis or the frontdoor's services.
"""
