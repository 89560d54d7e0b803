{{/* The release's full name, at most 63 characters (a DNS label). */}}
{{- define "lyra.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "lyra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lyra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lyra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "lyra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "lyra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "lyra.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lyra.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Names the controller and the chart must agree on. */}}
{{- define "lyra.webhookService" -}}{{ include "lyra.fullname" . }}-webhook{{- end -}}
{{- define "lyra.webhookSecret" -}}{{ include "lyra.fullname" . }}-webhook-tls{{- end -}}
{{- define "lyra.webhookConfiguration" -}}{{ include "lyra.fullname" . }}{{- end -}}
{{- define "lyra.leaseName" -}}{{ include "lyra.fullname" . }}-leader{{- end -}}
{{- define "lyra.stateSecret" -}}
{{- default (printf "%s-state" (include "lyra.fullname" .)) .Values.state.existingSecret -}}
{{- end -}}
{{- define "lyra.stateSecretKey" -}}
{{- if .Values.state.existingSecret -}}{{ .Values.state.existingSecretKey }}{{- else -}}url{{- end -}}
{{- end -}}
{{- define "lyra.leaderElect" -}}{{ if gt (int .Values.replicaCount) 1 }}true{{ end }}{{- end -}}

{{/* RBAC rules for each watched namespace (or cluster-wide). */}}
{{- define "lyra.rules.watched" }}
# Workflows: watched, the finalizer patched, status written.
- apiGroups: [lyra.dev]
  resources: [workflows]
  verbs: [get, list, watch, patch]
- apiGroups: [lyra.dev]
  resources: [workflows/status]
  verbs: [patch]
{{- if and .Values.definitions.enabled .Values.rbac.registeredGroups }}
# Objects of the kinds WorkflowDefinitions register (`*` covers no subresource).
- apiGroups: [{{ join ", " .Values.rbac.registeredGroups }}]
  resources: ["*"]
  verbs: [get, list, watch, patch]
- apiGroups: [{{ join ", " .Values.rbac.registeredGroups }}]
  resources: ["*/status"]
  verbs: [patch]
# Sensitive parameters of registered kinds are secretKeyRefs.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
# What happened, for kubectl describe.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/*
What workflows manage through Kubernetes::Object with the controller's access
(providers.kubernetesRules): in the ClusterRole, or in each watched namespace's Role.
*/}}
{{- define "lyra.rules.kubernetesObjects" -}}
{{- with .Values.providers.kubernetesRules }}
# What workflows manage through Kubernetes::Object (providers.kubernetesRules).
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
