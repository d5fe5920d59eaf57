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

{{/*
The prefix of every cluster-scoped name (ClusterRoles, ClusterRoleBindings): the fullname followed by the
release namespace, so that releases of one name in two namespaces do not collide. The one exception is the
release that config/default describes (fullname F in namespace F-system), whose cluster-scoped objects
keep config/default's names. Cluster-scoped names may be 253 characters long: nothing is truncated.
*/}}
{{- define "memcached-operator.clusterPrefix" -}}
{{- $fullname := include "memcached-operator.fullname" . -}}
{{- if eq .Release.Namespace (printf "%s-system" $fullname) -}}
{{- $fullname -}}
{{- else -}}
{{- printf "%s-%s" $fullname .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The leader-election Lease's name (in the release namespace): one per release. */}}
{{- define "memcached-operator.leaderElectionId" -}}
{{- default (printf "%s.cache.example.com" (include "memcached-operator.fullname" .)) .Values.leaderElection.id -}}
{{- end -}}

{{/* The namespace the operator watches with watch.scope=namespace: watch.namespace, else the release's. */}}
{{- define "memcached-operator.watchNamespace" -}}
{{- default .Release.Namespace .Values.watch.namespace -}}
{{- end -}}

{{/*
An image reference: include "memcached-operator.image" (list . REPOSITORY TAG DIGEST). global.imageRegistry,
when set, replaces the registry of REPOSITORY (its first component, when that names a host) or prefixes it;
a DIGEST pins the image and wins over the TAG.
*/}}
{{- define "memcached-operator.image" -}}
{{- $root := index . 0 -}}
{{- $repository := index . 1 -}}
{{- $tag := index . 2 -}}
{{- $digest := index . 3 -}}
{{- with ($root.Values.global).imageRegistry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = rest $parts | join "/" -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- end -}}
{{- if $digest -}}
{{- printf "%s@%s" $repository $digest -}}
{{- else if $tag -}}
{{- printf "%s:%s" $repository $tag -}}
{{- else -}}
{{- $repository -}}
{{- end -}}
{{- end -}}

{{/* The operator's image. */}}
{{- define "memcached-operator.operatorImage" -}}
{{- include "memcached-operator.image" (list . .Values.image.repository (.Values.image.tag | default (printf "v%s" .Chart.AppVersion)) .Values.image.digest) -}}
{{- end -}}

{{/* The image of memcached pods whose spec sets none (MEMCACHED_IMAGE), under global.imageRegistry too. */}}
{{- define "memcached-operator.memcachedImage" -}}
{{- include "memcached-operator.image" (list . .Values.memcachedImage "" "") -}}
{{- end -}}

{{/* Labels of every object: the chart's, then commonLabels. */}}
{{- define "memcached-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "memcached-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
metadata.annotations of an object: commonAnnotations merged with the object's own (which win); nothing when
both are empty. {{- with include "memcached-operator.annotations" (list . OWN) }}{{ . | nindent 2 }}{{ end }}
*/}}
{{- define "memcached-operator.annotations" -}}
{{- $all := merge (dict) (index . 1 | default dict) ((index . 0).Values.commonAnnotations | default dict) -}}
{{- with $all -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator's pods (config/manager's, plus the release). */}}
{{- define "memcached-operator.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/name: {{ include "memcached-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The operator's ServiceAccount: serviceAccount.name, else <fullname>-controller-manager. */}}
{{- define "memcached-operator.serviceAccountName" -}}
{{- default (printf "%s-controller-manager" (include "memcached-operator.fullname" .)) .Values.serviceAccount.name -}}
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
