"""AWS EBS backend (boto3 is imported only when the backend is built)."""

from csi.backends.aws.backend import AwsBackend

__all__ = ["AwsBackend"]
