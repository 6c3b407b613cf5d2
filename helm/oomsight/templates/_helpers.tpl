{{/* Names, labels and values shared by the templates. Every name starts with "oomsight.". */}}

{{- define "oomsight.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "oomsight.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "oomsight.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "oomsight.selectorLabels" -}}
app.kubernetes.io/name: {{ include "oomsight.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "oomsight.labels" -}}
helm.sh/chart: {{ include "oomsight.chart" . }}
{{ include "oomsight.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: oomsight
{{- end }}

{{- define "oomsight.webhookSelectorLabels" -}}
{{ include "oomsight.selectorLabels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "oomsight.webhookName" -}}
{{- printf "%s-webhook" (include "oomsight.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "oomsight.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "oomsight.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "oomsight.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "oomsight.webhookName" .)) .Values.selfManagedTls.secretName }}
{{- end }}

{{- define "oomsight.issuerName" -}}
{{- default (printf "%s-selfsigned" (include "oomsight.fullname" .)) .Values.certManager.issuerRef.name }}
{{- end }}

{{- define "oomsight.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* "true" when the webhook annotates pods with prometheus.io/*: auto means "unless a PodMonitor scrapes them". */}}
{{- define "oomsight.prometheusAnnotations" -}}
{{- $mode := toString .Values.sidecar.prometheusAnnotations }}
{{- if eq $mode "auto" }}
{{- (not .Values.podMonitor.enabled) | toString }}
{{- else }}
{{- $mode }}
{{- end }}
{{- end }}

{{/* Namespaces the webhook never touches: kube-system, its own, and the user's list. */}}
{{- define "oomsight.excludedNamespaces" -}}
{{- $all := concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces }}
{{- toJson (uniq $all) }}
{{- end }}

{{/* The restricted Pod Security context of every container the chart runs. */}}
{{- define "oomsight.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.sidecar.runAsUser }}
runAsGroup: {{ .Values.sidecar.runAsUser }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Requests/limits with empty entries left out. */}}
{{- define "oomsight.resources" -}}
{{- range $section := list "requests" "limits" }}
{{- $amounts := dict }}
{{- range $key, $value := (get $.resources $section | default dict) }}
{{- if $value }}{{- $_ := set $amounts $key $value }}{{- end }}
{{- end }}
{{- if $amounts }}
{{ $section }}:
  {{- toYaml $amounts | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/* A DNS-1123 name for an object made from a chart file: <fullname>-<kind>-<file base>. */}}
{{- define "oomsight.fileObjectName" -}}
{{- $base := base .path | trimSuffix (ext .path) | lower | replace "_" "-" | replace "." "-" }}
{{- printf "%s-%s-%s" (include "oomsight.fullname" .root) .kind $base | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* A rule's expression or description from its parts (dashboards/knob.py): literal strings, and
thresholds from .thresholds as "value" (an integral number without a decimal point), "percent"
(0.1 is 10%) or "times" (the value times .by). Formats exactly as knob.fill does. */}}
{{- define "oomsight.ruleText" -}}
{{- $t := .thresholds }}
{{- range .parts }}
{{- if kindIs "string" . }}
{{- . }}
{{- else }}
{{- $v := index $t .knob }}
{{- if kindIs "string" $v }}
{{- $v }}
{{- else if eq .as "percent" }}
{{- printf "%.0f%%" (mulf 100 $v) }}
{{- else }}
{{- $n := $v }}
{{- if eq .as "times" }}{{ $n = mulf $v .by }}{{ end }}
{{- if eq (float64 $n) (float64 (int64 $n)) }}{{ int64 $n }}{{ else }}{{ float64 $n }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
