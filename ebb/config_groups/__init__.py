"""The settings' groups, one class per operator's concern, in modules by area.

`ebb.config.Settings` combines them (every field is read flat, `settings.port`);
`ebb.config_reference` renders docs/CONFIGURATION.md from their docstrings and
descriptions.
"""
