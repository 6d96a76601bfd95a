//! A small SVG writer: rectangles, lines and text with a class each, every text escaped as
//! XML (host names and GPU models come from users and nodes). Enough for our pictures; no
//! dependency.

use std::fmt::Write;

/// An SVG document being written.
pub struct Svg {
    width: f64,
    height: f64,
    /// The rightmost and lowest point any text reaches (by [`text_extent`]): the canvas
    /// grows to hold it, so a long title or label is never clipped by the picture's edge.
    reach: (f64, f64),
    body: String,
}

/// A generous width of `text` at `size` pixels in DejaVu Sans (the widest font of the
/// family list): 0.58 em a character, where its average over mixed text is about 0.52.
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.58
}

/// Where a text drawn at `x` with `anchor` begins and ends.
pub fn text_extent(x: f64, size: f64, anchor: Anchor, text: &str) -> (f64, f64) {
    let w = text_width(text, size);
    match anchor {
        Anchor::Start => (x, x + w),
        Anchor::Middle => (x - w / 2.0, x + w / 2.0),
        Anchor::End => (x - w, x),
    }
}

/// `text` as XML character data or attribute value: `&`, `<`, `>`, `"` and `'` escaped,
/// control characters other than tab and newline (which XML 1.0 forbids) dropped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() && c != '\t' && c != '\n' => {}
            c => out.push(c),
        }
    }
    out
}

/// A number as SVG writes it: at most two decimals, no trailing zeros.
fn num(v: f64) -> String {
    let v = if v.is_finite() { v } else { 0.0 };
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// Where a text is anchored.
#[derive(Debug, Clone, Copy)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

impl Svg {
    pub fn new(width: f64, height: f64) -> Self {
        Svg {
            width,
            height,
            reach: (0.0, 0.0),
            body: String::new(),
        }
    }

    /// A rectangle of `class` filled with `fill`, with a tooltip (`title`) when not empty.
    #[allow(clippy::too_many_arguments)]
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, class: &str, fill: &str, title: &str) {
        let _ = write!(
            self.body,
            r#"<rect class="{}" x="{}" y="{}" width="{}" height="{}" fill="{}""#,
            escape(class),
            num(x),
            num(y),
            num(w.max(0.0)),
            num(h.max(0.0)),
            escape(fill)
        );
        if title.is_empty() {
            self.body.push_str("/>\n");
        } else {
            let _ = writeln!(self.body, "><title>{}</title></rect>", escape(title));
        }
    }

    /// An unfilled rectangle outlined in `stroke`.
    #[allow(clippy::too_many_arguments)]
    pub fn outline(
        &mut self,
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        class: &str,
        stroke: &str,
        width: f64,
    ) {
        let _ = writeln!(
            self.body,
            r#"<rect class="{}" x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{}" stroke-width="{}"/>"#,
            escape(class),
            num(x),
            num(y),
            num(w.max(0.0)),
            num(h.max(0.0)),
            escape(stroke),
            num(width)
        );
    }

    /// A line; `dash` as SVG's `stroke-dasharray`, empty for a solid one.
    #[allow(clippy::too_many_arguments)]
    pub fn line(
        &mut self,
        (x1, y1): (f64, f64),
        (x2, y2): (f64, f64),
        class: &str,
        stroke: &str,
        width: f64,
        dash: &str,
    ) {
        let dash = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, escape(dash))
        };
        let _ = writeln!(
            self.body,
            r#"<line class="{}" x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="{}"{dash}/>"#,
            escape(class),
            num(x1),
            num(y1),
            num(x2),
            num(y2),
            escape(stroke),
            num(width)
        );
    }

    /// A text of `size` pixels.
    pub fn text(&mut self, x: f64, y: f64, size: f64, anchor: Anchor, class: &str, text: &str) {
        let (_, right) = text_extent(x, size, anchor, text);
        self.reach = (self.reach.0.max(right), self.reach.1.max(y + size * 0.3));
        let anchor = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let _ = writeln!(
            self.body,
            r#"<text class="{}" x="{}" y="{}" font-size="{}" text-anchor="{anchor}">{}</text>"#,
            escape(class),
            num(x),
            num(y),
            num(size),
            escape(text)
        );
    }

    /// The picture's title, top left.
    pub fn title(&mut self, text: &str) {
        self.text(10.0, 22.0, 16.0, Anchor::Start, "title", text);
    }

    /// A line of explanation under the title, at the left edge.
    pub fn note(&mut self, y: f64, text: &str) {
        self.text(10.0, y, 11.0, Anchor::Start, "legend", text);
    }

    /// The document, with a white background and one font for every text.
    pub fn finish(self) -> String {
        format!(
            concat!(
                r#"<?xml version="1.0" encoding="UTF-8"?>"#,
                "\n",
                r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">"#,
                "\n",
                r#"<rect class="background" x="0" y="0" width="{w}" height="{h}" fill="white"/>"#,
                "\n{body}</svg>\n"
            ),
            w = num(self.width.max(self.reach.0 + 10.0)),
            h = num(self.height.max(self.reach.1 + 6.0)),
            body = self.body
        )
    }
}

/// A colour for `index` of `count` categories (pipeline stages): hues around the wheel,
/// skipping the reds that mark slow links and overflows.
pub fn category_colour(index: usize, count: usize) -> String {
    let count = count.max(1) as f64;
    let hue = 190.0 + 290.0 * (index as f64) / count;
    format!(
        "hsl({:.0},62%,{}%)",
        hue % 360.0,
        if index % 2 == 0 { 52 } else { 66 }
    )
}

/// A colour on a scale from slow (0.0: red) to fast (1.0: green) through yellow.
pub fn scale_colour(t: f64) -> String {
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    format!("hsl({:.0},70%,{:.0}%)", 120.0 * t, 48.0 + 4.0 * t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_users_is_escaped() {
        assert_eq!(
            escape("n<1>&\"x\"'y'\u{1}"),
            "n&lt;1&gt;&amp;&quot;x&quot;&apos;y&apos;"
        );
        let mut svg = Svg::new(10.0, 10.0);
        svg.text(1.0, 2.0, 3.0, Anchor::Start, "host", "<script>");
        svg.rect(0.0, 0.0, 1.0, 1.0, "gpu", "red", "a&b");
        let doc = svg.finish();
        assert!(
            doc.contains("&lt;script&gt;") && !doc.contains("<script>"),
            "{doc}"
        );
        assert!(doc.contains("<title>a&amp;b</title>"), "{doc}");
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(num(1.0), "1");
        assert_eq!(num(1.256), "1.26");
        assert_eq!(num(-0.001), "0");
        assert_eq!(num(f64::NAN), "0");
    }
}
