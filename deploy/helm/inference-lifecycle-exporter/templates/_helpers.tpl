{{/* The chart's name, app.kubernetes.io/name: the job label the alert rules match. */}}
{{- define "ile.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release name, with the chart's added unless it holds it already. */}}
{{- define "ile.fullname" -}}
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

{{- define "ile.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* What selects the DaemonSet's pods; never changes on upgrade. */}}
{{- define "ile.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ile.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ile.labels" -}}
helm.sh/chart: {{ include "ile.chart" . }}
{{ include "ile.selectorLabels" . }}
app.kubernetes.io/component: exporter
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ile.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ile.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ile.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* http, or https when the web config serves TLS: for the probes and the ServiceMonitor. */}}
{{- define "ile.scheme" -}}
{{- if .Values.webConfig.tls }}https{{ else }}http{{ end }}
{{- end }}

{{- define "ile.webConfigDir" -}}/etc/inference-lifecycle-exporter/web{{- end }}

{{/*
A TOML key: bare when it may be, else a quoted string.
*/}}
{{- define "ile.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/*
The keys of one TOML table, from a map: scalars and arrays first, written as JSON literals
(a JSON string, number, boolean or array of them is the same TOML value), then the nested
maps as [prefix.key] tables; name first, the rest sorted; nulls are left out.
Call with (dict "table" MAP "prefix" NAME).
*/}}
{{- define "ile.tomlBody" -}}
{{- $table := .table }}
{{- range $key := prepend (without (keys $table | sortAlpha) "name") "name" }}
{{- $value := index $table $key }}
{{- if not (or (kindIs "map" $value) (kindIs "invalid" $value)) }}
{{ include "ile.tomlKey" $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- range $key := keys $table | sortAlpha }}
{{- $value := index $table $key }}
{{- if kindIs "map" $value }}
{{- $name := printf "%s.%s" $.prefix (include "ile.tomlKey" $key) }}

[{{ $name }}]
{{- include "ile.tomlBody" (dict "table" $value "prefix" $name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The discovery table's keys shared by Kubernetes and Docker. */}}
{{- define "ile.discoveryKeys" -}}
name_template = {{ .nameTemplate | toJson }}
grace = {{ .grace | toJson }}
{{- with .probeTimeout }}
probe_timeout = {{ toJson . }}
{{- end }}
{{- end }}

{{/* config.toml. */}}
{{- define "ile.config" -}}
{{- $c := .Values.config -}}
[exporter]
interval = {{ $c.interval | toJson }}
state_directory = {{ .Values.hostPaths.state | toJson }}
nvml = {{ $c.nvml }}
{{- include "ile.tomlBody" (dict "table" (omit $c.exporter "interval" "state_directory" "nvml") "prefix" "exporter") }}
{{- with $c.discovery.kubernetes }}
{{- if .enabled }}

[discovery.kubernetes]
# node_name from $NODE_NAME (the downward API), credentials from the service account
select = {{ .select | toJson }}
{{ include "ile.discoveryKeys" . }}
{{- end }}
{{- end }}
{{- with $c.discovery.docker }}
{{- if .enabled }}

[discovery.docker]
socket = {{ .socket | toJson }}
{{ include "ile.discoveryKeys" . }}
{{- end }}
{{- end }}
{{- range $c.targets }}

[[target]]
{{- include "ile.tomlBody" (dict "table" . "prefix" "target") }}
{{- end }}
{{- end }}
