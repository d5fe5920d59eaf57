{{/*
The prefix of every object name: the release name when it contains the chart's name (so that release
"memcached-operator" names its objects as config/default does: memcached-operator-controller-manager, ...),
else <release>-<chart>.
*/}}
{{- define "memcached-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "memcached-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "memcached-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "memcached-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels that select the operator's pods (config/manager's, plus the release). */}}
{{- define "memcached-operator.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/name: {{ include "memcached-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "memcached-operator.serviceAccountName" -}}
{{ include "memcached-operator.fullname" . }}-controller-manager
{{- end -}}

{{/* The rules of one role, from the generated files/rbac-rules.yaml: include "memcached-operator.rules" (list . "manager"). */}}
{{- define "memcached-operator.rules" -}}
{{- $all := (index . 0).Files.Get "files/rbac-rules.yaml" | fromYaml -}}
{{- toYaml (index $all (index . 1)) -}}
{{- end -}}

{{/* The metrics Service: a Service name is a DNS label (63 characters at most). */}}
{{- define "memcached-operator.metricsServiceName" -}}
{{- printf "%s-controller-manager-metrics-service" (include "memcached-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
