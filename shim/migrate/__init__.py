"""The migration controller: converts stored in-tree PersistentVolumes to native CSI ones and back.

Modules, bottom up:
- kube: plain-JSON Kubernetes API access (the only module that talks HTTP), counted per request;
- objects: pure helpers over PV / StorageClass dicts: records, conversion targets, disk identity;
- journal: the durable record of one PV's conversion or rollback, step by step;
- lock: the per-PV Lease that holds the journal and keeps two actors off one PV;
- leader: leader election on a coordination.k8s.io/v1 Lease;
- usage: whether a volume is in use (VolumeAttachment, non-terminated Pod);
- steps + engine: the journaled, idempotent sequence itself;
- twins: CSI twins of in-tree StorageClasses;
- cache, workqueue, controller: the long-running controller; oneshot: apply / rollback / status;
- events, metrics, logs, options: the controller's outputs and flags.

Nothing here imports csi or grpc; the kubernetes package is imported only when a client is built.
"""
