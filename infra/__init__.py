"""scaletrain infrastructure: the CDK app and the instance catalog."""
