"""Reading the platform's /metrics as numbers tests can compare before and after."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One scrape of /metrics: sample values by name and labels."""

    def __init__(self, text: str):
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels` (0 if none)."""
        return sum(
            v
            for n, sample_labels, v in self.samples
            if n == name and all(sample_labels.get(k) == want for k, want in labels.items())
        )

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [sample_labels for n, sample_labels, _ in self.samples if n == name]


def scrape(client: httpx.Client) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return Scrape(response.text)
