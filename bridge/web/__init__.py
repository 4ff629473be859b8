"""Serve HTTP (an edge): the webhook route, page logins, the /runs pages with their SVG charts,
and the runbook page."""
