// Command helm-render renders a Helm chart the way `helm template` does, for hosts where no
// helm binary installs from a registry (the tests of deploy/helm run it).
//
// It is Helm's rendering engine rebuilt on the same parts Helm is built on: Go's
// text/template, the sprig function library (Debian's golang-github-masterminds-sprig-dev),
// YAML through JSON (ghodss/yaml, the library sigs.k8s.io/yaml forked, so numbers, key order
// and toYaml's output are Helm's) and values.schema.json checked by gojsonschema, the
// validator Helm 3 used. What it follows, from helm's pkg/engine, pkg/chartutil and
// pkg/releaseutil:
//   - values: values.yaml, then every -f file deep-merged in order, then --set and
//     --set-string (dotted keys, name[N] indices, {a,b} lists; true/false/null/integers
//     typed, as strvals types them); a user null deletes a default; the result is validated
//     against values.schema.json before anything renders;
//   - the render context: .Values, .Release (Name, Namespace, IsInstall, IsUpgrade,
//     Revision, Service "Helm"), .Chart (Chart.yaml, capitalised fields), .Capabilities
//     (KubeVersion, APIVersions.Has), .Files (every chart file outside templates/ and the
//     chart's own metadata) and .Template (Name, BasePath);
//   - functions: sprig's less env and expandenv, plus include, tpl, required, toYaml,
//     fromYaml, fromYamlArray, toJson, fromJson, fromJsonArray and lookup (empty, as with
//     `helm template`); missing keys render empty;
//   - output: templates whose name starts with "_" are parsed, not rendered; NOTES.txt is
//     kept apart (--notes prints it); each file is split on "---", whitespace-only documents
//     are dropped, every document must parse as YAML, and they are printed in Helm's install
//     order, each after "---" and a "# Source:" line.
//
// Not supported, and refused by name rather than rendered wrongly: subcharts and
// dependencies. Also absent: toToml, .helmignore, hooks (printed like any manifest).
//
// Build (GOPATH mode, against Debian's packages):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o helm-render ./tools/helm-render
//
// Usage: helm-render [--name R] [-n NS] [-f values.yaml]... [--set k=v]... [--kube-version v]
// [--api-versions group/version]... [--notes] CHART_DIR
package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"github.com/ghodss/yaml"
	"github.com/xeipuuv/gojsonschema"
)

// Metadata is Chart.yaml, with the field names templates use (.Chart.Name, .Chart.AppVersion).
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	Home         string            `json:"home,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Version      string            `json:"version,omitempty"`
	Description  string            `json:"description,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Maintainers  []map[string]any  `json:"maintainers,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	APIVersion   string            `json:"apiVersion,omitempty"`
	Condition    string            `json:"condition,omitempty"`
	Tags         string            `json:"tags,omitempty"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []map[string]any  `json:"dependencies,omitempty"`
	Type         string            `json:"type,omitempty"`
}

// KubeVersion is .Capabilities.KubeVersion.
type KubeVersion struct {
	Version string
	Major   string
	Minor   string
}

// String is the version as "v1.31.0".
func (k KubeVersion) String() string { return k.Version }

// GitVersion is the version as the API server reports it.
func (k KubeVersion) GitVersion() string { return k.Version }

// VersionSet is .Capabilities.APIVersions: "group/version" and "group/version/Kind" entries.
type VersionSet []string

// Has says whether the cluster serves an API version (or version/Kind).
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// Capabilities is .Capabilities.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion map[string]string
}

// The built-in API versions a cluster without CRDs serves: what `helm template` assumes
// when --api-versions adds nothing.
var builtinAPIVersions = []string{
	"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v1", "autoscaling/v2",
	"rbac.authorization.k8s.io/v1", "networking.k8s.io/v1", "storage.k8s.io/v1",
	"scheduling.k8s.io/v1", "node.k8s.io/v1", "coordination.k8s.io/v1",
	"apiextensions.k8s.io/v1", "admissionregistration.k8s.io/v1", "discovery.k8s.io/v1",
	"certificates.k8s.io/v1", "events.k8s.io/v1",
}

// Files is .Files: the chart's non-template files by path relative to the chart.
type Files map[string][]byte

// Get is a file's text ("" when absent, as in Helm).
func (f Files) Get(name string) string { return string(f[name]) }

// GetBytes is a file's bytes.
func (f Files) GetBytes(name string) []byte { return f[name] }

// Lines is a file's lines.
func (f Files) Lines(name string) []string {
	if f[name] == nil {
		return []string{}
	}
	return strings.Split(string(f[name]), "\n")
}

// Glob is the files whose path matches a shell pattern (path.Match: no "**").
func (f Files) Glob(pattern string) Files {
	out := Files{}
	for name, data := range f {
		if ok, _ := path.Match(pattern, name); ok {
			out[name] = data
		}
	}
	return out
}

// AsConfig is the files as a ConfigMap's data block (base names as keys).
func (f Files) AsConfig() string {
	m := map[string]string{}
	for name, data := range f {
		m[path.Base(name)] = string(data)
	}
	return toYAML(m)
}

// AsSecrets is the files as a Secret's data block (base64 values).
func (f Files) AsSecrets() string {
	m := map[string]string{}
	for name, data := range f {
		m[path.Base(name)] = base64.StdEncoding.EncodeToString(data)
	}
	return toYAML(m)
}

type chart struct {
	dir       string
	meta      Metadata
	defaults  map[string]any
	schema    []byte
	templates map[string]string // "name/templates/x.yaml" -> source
	files     Files
}

func loadChart(dir string) (*chart, error) {
	c := &chart{dir: dir, templates: map[string]string{}, files: Files{}}
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("Chart.yaml file is missing: %w", err)
	}
	if err := yaml.Unmarshal(raw, &c.meta); err != nil {
		return nil, fmt.Errorf("cannot load Chart.yaml: %w", err)
	}
	switch {
	case c.meta.APIVersion != "v1" && c.meta.APIVersion != "v2":
		return nil, fmt.Errorf("validation: chart.metadata.apiVersion %q is not v1 or v2", c.meta.APIVersion)
	case c.meta.Name == "":
		return nil, errors.New("validation: chart.metadata.name is required")
	case c.meta.Version == "":
		return nil, errors.New("validation: chart.metadata.version is required")
	case c.meta.Type != "" && c.meta.Type != "application":
		return nil, fmt.Errorf("chart type %q is not supported by this renderer", c.meta.Type)
	case len(c.meta.Dependencies) > 0:
		return nil, errors.New("chart dependencies are not supported by this renderer")
	}
	if _, err := semver.StrictNewVersion(c.meta.Version); err != nil {
		return nil, fmt.Errorf("validation: chart.metadata.version %q is invalid", c.meta.Version)
	}
	c.defaults = map[string]any{}
	if raw, err := os.ReadFile(filepath.Join(dir, "values.yaml")); err == nil {
		if err := yaml.Unmarshal(raw, &c.defaults); err != nil {
			return nil, fmt.Errorf("cannot load values.yaml: %w", err)
		}
		if c.defaults == nil {
			c.defaults = map[string]any{}
		}
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "values.schema.json")); err == nil {
		c.schema = raw
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "charts" {
				return errors.New("subcharts (charts/) are not supported by this renderer")
			}
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			c.templates[path.Join(c.meta.Name, rel)] = string(data)
		case rel == "Chart.yaml" || rel == "values.yaml" || rel == "values.schema.json":
		default:
			c.files[rel] = data
		}
		return nil
	})
	return c, err
}

// --- values --------------------------------------------------------------------------------

// mergeMaps merges b into a copy of a, recursing into tables: how -f files and --set stack.
func mergeMaps(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vm, ok := v.(map[string]any); ok {
			if om, ok := out[k].(map[string]any); ok {
				out[k] = mergeMaps(om, vm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// coalesce lays the chart's defaults under the user's values: the user's win, tables merge,
// and a user null deletes the default (Helm's CoalesceValues).
func coalesce(user, defaults map[string]any) map[string]any {
	out := make(map[string]any, len(user))
	for k, v := range user {
		out[k] = v
	}
	for k, dv := range defaults {
		uv, ok := out[k]
		switch {
		case !ok:
			out[k] = deepCopy(dv)
		case uv == nil:
			delete(out, k)
		default:
			um, uok := uv.(map[string]any)
			dm, dok := dv.(map[string]any)
			if uok && dok {
				out[k] = coalesce(um, dm)
			} else if uok != dok && dv != nil {
				fmt.Fprintf(os.Stderr, "coalesce.go: warning: cannot overwrite table with non table for %s\n", k)
			}
		}
	}
	return out
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// typedVal types a --set value as Helm's strvals does; --set-string keeps it a string.
func typedVal(val string, asString bool) any {
	if asString {
		return val
	}
	switch strings.ToLower(val) {
	case "true":
		return true
	case "false":
		return false
	case "null":
		return nil
	}
	if val == "0" {
		return int64(0)
	}
	if len(val) > 0 && val[0] != '0' {
		if n, err := strconv.ParseInt(val, 10, 64); err == nil {
			return n
		}
	}
	return val
}

// splitUnescaped splits on sep outside braces, honouring backslash escapes (kept for later).
func splitUnescaped(s string, sep byte) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '{':
			depth++
		case '}':
			depth--
		case sep:
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// unescapedBraces is s with escaped characters removed: what is left are its real braces.
func unescapedBraces(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

var indexed = regexp.MustCompile(`^(.*)\[(\d+)\]$`)

// parseSet applies one --set argument ("a.b=1,c[0]=x,d={p,q}") to vals.
func parseSet(vals map[string]any, arg string, asString bool) error {
	for _, pair := range splitUnescaped(arg, ',') {
		key, val, ok := strings.Cut(pair, "=")
		if !ok || key == "" {
			return fmt.Errorf("failed parsing --set data: key %q has no value", pair)
		}
		var value any
		if strings.HasPrefix(val, "{") {
			if len(val) < 2 || !strings.HasSuffix(val, "}") ||
				strings.ContainsAny(unescapedBraces(val[1:len(val)-1]), "{}") {
				return fmt.Errorf("failed parsing --set data %q: a list is {a,b}; escape other braces with \\", pair)
			}
			inner := val[1 : len(val)-1]
			list := []any{}
			if inner != "" {
				for _, item := range splitUnescaped(inner, ',') {
					list = append(list, typedVal(unescape(item), asString))
				}
			}
			value = list
		} else {
			value = typedVal(unescape(val), asString)
		}
		if err := setPath(vals, splitUnescaped(key, '.'), value); err != nil {
			return fmt.Errorf("failed parsing --set data %q: %w", pair, err)
		}
	}
	return nil
}

func setPath(m map[string]any, keys []string, value any) error {
	name := unescape(keys[0])
	index := -1
	if g := indexed.FindStringSubmatch(keys[0]); g != nil {
		name = unescape(g[1])
		index, _ = strconv.Atoi(g[2])
	}
	if index < 0 {
		if len(keys) == 1 {
			m[name] = value
			return nil
		}
		child, ok := m[name].(map[string]any)
		if !ok {
			child = map[string]any{}
			m[name] = child
		}
		return setPath(child, keys[1:], value)
	}
	if index > 65536 {
		return errors.New("index too large")
	}
	list, _ := m[name].([]any)
	for len(list) <= index {
		list = append(list, nil)
	}
	m[name] = list
	if len(keys) == 1 {
		list[index] = value
		return nil
	}
	child, ok := list[index].(map[string]any)
	if !ok {
		child = map[string]any{}
		list[index] = child
	}
	return setPath(child, keys[1:], value)
}

// validate checks the coalesced values against values.schema.json, as Helm does before
// rendering; the message is Helm's.
func validate(c *chart, vals map[string]any) error {
	if c.schema == nil {
		return nil
	}
	doc, err := json.Marshal(vals)
	if err != nil {
		return err
	}
	schema, err := yaml.YAMLToJSON(c.schema)
	if err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(doc))
	if err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	if result.Valid() {
		return nil
	}
	var sb strings.Builder
	for _, e := range result.Errors() {
		fmt.Fprintf(&sb, "- %s\n", e)
	}
	return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s",
		c.meta.Name, sb.String())
}

// --- the engine ----------------------------------------------------------------------------

func toYAML(v any) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

const (
	warnStart     = "HELM_ERR_START"
	warnEnd       = "HELM_ERR_END"
	recursionMax  = 1000
	notesFileName = "NOTES.txt"
)

var warnRegex = regexp.MustCompile(warnStart + `(.*)` + warnEnd)

type engine struct {
	templates map[string]string
	included  map[string]int
}

// funcs is Helm's function map, its closures bound to the template set t.
func (e *engine) funcs(t *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = func(s string) map[string]any {
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromYamlArray"] = func(s string) []any {
		a := []any{}
		if err := yaml.Unmarshal([]byte(s), &a); err != nil {
			a = []any{err.Error()}
		}
		return a
	}
	f["toJson"] = func(v any) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	f["fromJson"] = func(s string) map[string]any {
		m := map[string]any{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromJsonArray"] = func(s string) []any {
		a := []any{}
		if err := json.Unmarshal([]byte(s), &a); err != nil {
			a = []any{err.Error()}
		}
		return a
	}
	f["lookup"] = func(string, string, string, string) (map[string]any, error) {
		return map[string]any{}, nil
	}
	f["required"] = func(warn string, val any) (any, error) {
		if val == nil {
			return val, errors.New(warnStart + warn + warnEnd)
		}
		if s, ok := val.(string); ok && s == "" {
			return val, errors.New(warnStart + warn + warnEnd)
		}
		return val, nil
	}
	f["include"] = func(name string, data any) (string, error) {
		if e.included[name] > recursionMax {
			return "", fmt.Errorf("rendering template has a nested reference name: %s: unable to execute template", name)
		}
		e.included[name]++
		defer func() { e.included[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	f["tpl"] = func(text string, vals map[string]any) (string, error) {
		tmpl, _ := vals["Template"].(map[string]any)
		name, _ := tmpl["Name"].(string)
		if name == "" {
			return "", fmt.Errorf("cannot retrieve Template.Name from values inside tpl function: %s", text)
		}
		set, err := e.parse(map[string]string{name: text})
		if err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", text, err)
		}
		var buf strings.Builder
		if err := set.ExecuteTemplate(&buf, name, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", text, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	return f
}

// sortTemplates orders names deepest path first, then by name descending: Helm's parse order.
func sortTemplates(names []string) []string {
	sort.Slice(names, func(i, j int) bool {
		a, b := names[i], names[j]
		ca, cb := strings.Count(a, "/"), strings.Count(b, "/")
		if ca == cb {
			return a > b
		}
		return ca > cb
	})
	return names
}

// parse builds one template set from every chart template, with extra (a tpl string)
// parsed first so that it takes the name of the template that called tpl.
func (e *engine) parse(extra map[string]string) (*template.Template, error) {
	t := template.New("gotpl").Option("missingkey=zero")
	t.Funcs(e.funcs(t))
	names := make([]string, 0, len(e.templates))
	for name := range e.templates {
		names = append(names, name)
	}
	for name, text := range extra {
		if _, err := t.New(name).Parse(text); err != nil {
			return nil, cleanupParseError(name, err)
		}
	}
	for _, name := range sortTemplates(names) {
		if t.Lookup(name) != nil { // the tpl string took this file's name
			continue
		}
		if _, err := t.New(name).Parse(e.templates[name]); err != nil {
			return nil, cleanupParseError(name, err)
		}
	}
	return t, nil
}

func cleanupParseError(name string, err error) error {
	tokens := strings.Split(err.Error(), ": ")
	if len(tokens) == 1 {
		return fmt.Errorf("parse error in (%s): %s", name, err)
	}
	return fmt.Errorf("parse error at (%s): %s", tokens[1], tokens[len(tokens)-1])
}

func cleanupExecError(name string, err error) error {
	var execErr template.ExecError
	if !errors.As(err, &execErr) {
		return err
	}
	tokens := strings.SplitN(err.Error(), ": ", 3)
	if len(tokens) != 3 {
		return fmt.Errorf("execution error in (%s): %s", name, err)
	}
	if parts := warnRegex.FindStringSubmatch(tokens[2]); len(parts) >= 2 {
		return fmt.Errorf("execution error at (%s): %s", tokens[1], parts[1])
	}
	return err
}

// render executes every template that is not a partial: file name -> output.
func (e *engine) render(top map[string]any, basePath string) (map[string]string, error) {
	t, err := e.parse(nil)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	names := make([]string, 0, len(e.templates))
	for name := range e.templates {
		names = append(names, name)
	}
	for _, name := range sortTemplates(names) {
		if strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		top["Template"] = map[string]any{"Name": name, "BasePath": basePath}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, top); err != nil {
			return nil, cleanupExecError(name, err)
		}
		out[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return out, nil
}

// --- manifests -----------------------------------------------------------------------------

var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
	"ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
	"DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService",
}

var separator = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

type manifest struct {
	source, kind, content string
}

// manifests splits the rendered files into documents in Helm's install order.
func manifests(rendered map[string]string) ([]manifest, error) {
	rank := map[string]int{}
	for i, k := range installOrder {
		rank[k] = i
	}
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []manifest
	for _, name := range names {
		text := rendered[name]
		if strings.TrimSpace(text) == "" {
			continue
		}
		for _, doc := range separator.Split(strings.TrimSpace(text), -1) {
			doc = strings.TrimSpace(doc)
			if doc == "" {
				continue
			}
			var head struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return nil, fmt.Errorf("YAML parse error on %s: %w", name, err)
			}
			out = append(out, manifest{source: name, kind: head.Kind, content: doc})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		ri, iok := rank[out[i].kind]
		rj, jok := rank[out[j].kind]
		switch {
		case iok && jok:
			return ri < rj
		case iok != jok:
			return iok
		default:
			return out[i].kind < out[j].kind
		}
	})
	return out, nil
}

// --- command line --------------------------------------------------------------------------

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func kubeVersion(v string) (KubeVersion, error) {
	parsed, err := semver.NewVersion(v)
	if err != nil {
		return KubeVersion{}, fmt.Errorf("invalid kube version %q: %w", v, err)
	}
	return KubeVersion{
		Version: "v" + parsed.String(),
		Major:   strconv.FormatUint(parsed.Major(), 10),
		Minor:   strconv.FormatUint(parsed.Minor(), 10),
	}, nil
}

func run(args []string) error {
	fl := flag.NewFlagSet("helm-render", flag.ContinueOnError)
	release := fl.String("name", "release-name", "release name")
	namespace := fl.String("namespace", "default", "release namespace")
	fl.StringVar(namespace, "n", "default", "release namespace (shorthand)")
	kube := fl.String("kube-version", "v1.31.0", "Kubernetes version for .Capabilities")
	upgrade := fl.Bool("is-upgrade", false, "render as an upgrade (.Release.IsUpgrade)")
	notes := fl.Bool("notes", false, "print the rendered NOTES.txt instead of the manifests")
	var valueFiles, sets, setStrings, apiVersions repeated
	fl.Var(&valueFiles, "f", "values file (repeatable)")
	fl.Var(&valueFiles, "values", "values file (repeatable)")
	fl.Var(&sets, "set", "key=value (repeatable)")
	fl.Var(&setStrings, "set-string", "key=value kept a string (repeatable)")
	fl.Var(&apiVersions, "api-versions", "extra API version for .Capabilities (repeatable)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() != 1 {
		return errors.New("usage: helm-render [flags] CHART_DIR")
	}
	c, err := loadChart(fl.Arg(0))
	if err != nil {
		return err
	}
	kv, err := kubeVersion(*kube)
	if err != nil {
		return err
	}
	if c.meta.KubeVersion != "" {
		constraint, err := semver.NewConstraint(c.meta.KubeVersion)
		if err != nil {
			return fmt.Errorf("Chart.yaml: kubeVersion %q: %w", c.meta.KubeVersion, err)
		}
		if v, _ := semver.NewVersion(kv.Version); !constraint.Check(v) {
			return fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s",
				c.meta.KubeVersion, kv.Version)
		}
	}
	user := map[string]any{}
	for _, file := range valueFiles {
		raw, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("failed to parse %s: %w", file, err)
		}
		user = mergeMaps(user, m)
	}
	for _, s := range sets {
		if err := parseSet(user, s, false); err != nil {
			return err
		}
	}
	for _, s := range setStrings {
		if err := parseSet(user, s, true); err != nil {
			return err
		}
	}
	vals := coalesce(user, c.defaults)
	if err := validate(c, vals); err != nil {
		return err
	}
	top := map[string]any{
		"Values": vals,
		"Release": map[string]any{
			"Name": *release, "Namespace": *namespace, "IsInstall": !*upgrade,
			"IsUpgrade": *upgrade, "Revision": 1, "Service": "Helm",
		},
		"Chart": &c.meta,
		"Capabilities": &Capabilities{
			KubeVersion: kv,
			APIVersions: append(VersionSet(builtinAPIVersions), apiVersions...),
			HelmVersion: map[string]string{"Version": "v3"},
		},
		"Files": c.files,
	}
	e := &engine{templates: c.templates, included: map[string]int{}}
	rendered, err := e.render(top, path.Join(c.meta.Name, "templates"))
	if err != nil {
		return err
	}
	notesName := path.Join(c.meta.Name, "templates", notesFileName)
	if *notes {
		fmt.Print(rendered[notesName])
		return nil
	}
	delete(rendered, notesName)
	docs, err := manifests(rendered)
	if err != nil {
		return err
	}
	for _, m := range docs {
		fmt.Printf("---\n# Source: %s\n%s\n", m.source, m.content)
	}
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %s\n", err)
		os.Exit(1)
	}
}
