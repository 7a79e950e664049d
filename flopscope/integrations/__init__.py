"""Integrations with training frameworks, one module each, imported only when used: the
core never imports them, and each is the only place that knows its framework."""
