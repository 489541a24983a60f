"""In-process feeds from trainers to the sidecar. Each integration imports its framework itself, so importing the
exporter never imports a training library: `exporter.integrations.trl` needs the `trl` extra (transformers)."""
