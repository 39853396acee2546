{{/* Chart name, overridable. */}}
{{- define "ballast.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name: fullnameOverride, or the release name (with the chart name unless it already holds it). */}}
{{- define "ballast.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "ballast.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* CSI driver name: explicit, or fixed by the backend. */}}
{{- define "ballast.driverName" -}}
{{- if .Values.backend.driverName -}}
{{- .Values.backend.driverName -}}
{{- else if eq .Values.backend.name "aws" -}}
ebs.csi.aws.com
{{- else -}}
local.csi.ballast.dev
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "ballast.labels" -}}
app.kubernetes.io/name: {{ include "ballast.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ballast-csi
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.customLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component ("controller" or "node"); pass (list $ "controller"). */}}
{{- define "ballast.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "ballast.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "ballast.controllerServiceAccount" -}}
{{- default (printf "%s-controller" (include "ballast.fullname" .)) .Values.controller.serviceAccount.name -}}
{{- end -}}

{{- define "ballast.migrationServiceAccount" -}}
{{- default (printf "%s-migration" (include "ballast.fullname" .)) .Values.migration.serviceAccount.name -}}
{{- end -}}

{{- define "ballast.nodeServiceAccount" -}}
{{- default (printf "%s-node" (include "ballast.fullname" .)) .Values.node.serviceAccount.name -}}
{{- end -}}

{{/* Driver image reference. */}}
{{- define "ballast.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Controller replicas: explicit, else 1 for local (one host owns the data dir), 2 for aws. */}}
{{- define "ballast.controllerReplicas" -}}
{{- if not (kindIs "invalid" .Values.controller.replicas) -}}
{{- .Values.controller.replicas -}}
{{- else if eq .Values.backend.name "local" -}}
1
{{- else -}}
2
{{- end -}}
{{- end -}}

{{/* The migration controller's --feature-gates value ("A=true,B=false", sorted). */}}
{{- define "ballast.migrationGates" -}}
{{- $gates := list -}}
{{- range $name, $on := .Values.migration.featureGates -}}
{{- $gates = append $gates (printf "%s=%t" $name $on) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}

{{/* Driver arguments common to both modes (backend, names, logging). */}}
{{- define "ballast.driverCommonArgs" -}}
- --endpoint=$(CSI_ENDPOINT)
- --backend={{ .Values.backend.name }}
- --driver-name={{ include "ballast.driverName" . }}
- --log-format={{ .Values.driver.logFormat }}
- --log-level={{ .Values.driver.logLevel }}
{{- with .Values.driver.workers }}
- --workers={{ . }}
{{- end }}
{{- if eq .Values.backend.name "local" }}
- --data-dir={{ .Values.backend.local.dataDir }}
{{- with .Values.backend.local.capacity }}
- --capacity={{ . }}
{{- end }}
{{- with .Values.backend.local.zone }}
- --zone={{ . }}
{{- end }}
{{- with .Values.backend.local.region }}
- --region={{ . }}
{{- end }}
{{- else }}
{{- with .Values.backend.aws.region }}
- --aws-region={{ . }}
{{- end }}
{{- with .Values.backend.aws.endpointUrl }}
- --aws-endpoint-url={{ . }}
{{- end }}
{{- with .Values.backend.aws.describeBatchWindow }}
- --aws-describe-batch-window={{ . }}
{{- end }}
{{- with .Values.backend.aws.extraTags }}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
- {{ printf "--aws-extra-tags=%s" (join "," $pairs) | quote }}
{{- end }}
{{- with .Values.backend.aws.k8sTagClusterId }}
- --aws-k8s-tag-cluster-id={{ . }}
{{- end }}
{{- if .Values.backend.aws.warnOnInvalidTag }}
- --aws-warn-on-invalid-tag
{{- end }}
{{- end }}
{{- end -}}

{{/* Security context of every non-privileged container. */}}
{{- define "ballast.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Tolerations of the node DaemonSet: all, or node.tolerations plus the driver's startup taint
<driver>/agent-not-ready:NoExecute, which only this pod removes (it must land on the nodes it untaints). */}}
{{- define "ballast.nodeTolerations" -}}
{{- if .Values.node.tolerateAllTaints -}}
- operator: Exists
{{- else -}}
{{- $startup := dict "key" (printf "%s/agent-not-ready" (include "ballast.driverName" .)) "operator" "Exists" "effect" "NoExecute" -}}
{{- toYaml (append (.Values.node.tolerations | default list) $startup) -}}
{{- end -}}
{{- end -}}

{{/* timeoutSeconds of the kubelet probes that call the livenessprobe sidecar: its --probe-timeout (whole
seconds, "10s") plus one, so the sidecar answers with the driver's error before kubelet gives up. */}}
{{- define "ballast.healthProbeTimeoutSeconds" -}}
{{- add1 (.Values.sidecars.livenessProbe.probeTimeout | trimSuffix "s" | atoi) -}}
{{- end -}}

{{/* terminationGracePeriodSeconds of the driver's pods: on SIGTERM the driver drains in-flight calls for
up to GRACE_SECONDS (30, csi/server.py), waits up to SETTLE_SECONDS (10) for the handlers of the calls it
then cancels, and releases its socket and backend; 5 s on top so a full drain ends before kubelet's
SIGKILL (tests/chart/test_shutdown.py keeps them in step). */}}
{{- define "ballast.terminationGracePeriodSeconds" -}}
45
{{- end -}}

{{/* Sidecar arguments for leader election. */}}
{{- define "ballast.leaderElectionArgs" -}}
- --leader-election=true
- --leader-election-namespace={{ .Release.Namespace }}
- --leader-election-lease-duration={{ .Values.leaderElection.leaseDuration }}
- --leader-election-renew-deadline={{ .Values.leaderElection.renewDeadline }}
- --leader-election-retry-period={{ .Values.leaderElection.retryPeriod }}
{{- end -}}
