"""Trainer: learns from claw.samples and publishes new weights without stopping service."""
