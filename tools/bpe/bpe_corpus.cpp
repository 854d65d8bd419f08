// The built-in BPE training text (see bpe_trainer.h): original prose, dialogue, code and other scripts,
// written for Tandem. Varied on purpose, so that the merges cover common English words, code
// punctuation and indentation, digits, and multi-byte scripts.
#include <string>

#include "tools/bpe/bpe_trainer.h"

namespace tandem {

namespace {

constexpr const char* kProse = R"TXT(The river that runs through the old town is not wide, but it is quick and cold, even in August. In the morning the mist sits on the water like a sheet that nobody has folded, and the first people on the bridge are the bakers, the postman, and a woman who walks a grey dog at exactly half past six. By eight o'clock the mist is gone, the shops have opened their shutters, and the river looks ordinary again: brown near the banks, green in the middle, and full of small stones that click against each other when the current is strong.

People who grew up here say that you can tell the season by the sound of the water. In spring it is loud, because the snow on the hills is melting and every stream is in a hurry. In summer it is quiet enough to hear the swallows. In autumn the leaves gather in the slow places and the water seems to whisper. In winter, on the coldest nights, the edges freeze and the middle keeps moving, and the sound is thin and sharp, like a knife on a plate.

There is a story that the town was built here because a merchant's cart broke a wheel on the ford, and while he waited for a new one he sold everything he had to the farmers who came down from the valley. The next year he came back on purpose, and the year after that he built a house. Whether this is true or not, nobody can say. The oldest document in the town archive is a tax record from a much later century, and it mentions only a mill, a church, eleven houses, and "a bridge of wood, in poor repair".

How bread is made is simple to describe and hard to do well. You mix flour, water, salt and a little yeast, and you knead the dough until it is smooth and springs back when you press it. Then you wait. The yeast eats some of the sugar in the flour and breathes out gas, and the gas is trapped in a web of gluten, so the dough rises. You shape it, let it rise again, and bake it in a hot oven. A good loaf has a crisp crust, a soft and open crumb, and a smell that fills the whole house. A bad loaf is heavy, pale, or burnt, and usually the baker knows exactly which step went wrong.

Most of the skill is in the waiting. A dough that rises too fast in a warm kitchen will taste flat; a dough that rises slowly overnight in a cool room will taste rich and slightly sour. Professional bakers talk about temperature the way sailors talk about the wind. They measure the flour, the water, and the room, and they adjust one to balance the others. At home, most of us simply watch the dough and learn, after many loaves, what "doubled in size" really looks like.

The path to the lake starts behind the school and climbs through a forest of pine and birch. For the first hour it is steep and rocky, and you hear nothing but your own breathing and the crunch of needles under your boots. Then the trees open, the ground becomes flat and soft, and you see the water: dark blue, perfectly still, with the mountains standing upside down in it. Every time I arrive there I stop and say nothing for a minute, because there is nothing useful to say.

Learning a new language as an adult is humbling. You know what you want to say, and you know that a child could say it, and still the words do not come. At first you collect nouns: bread, train, ticket, window, rain. Then verbs, which are harder because they change their shape. Then the small words, the ones that hold sentences together, which are the hardest of all because they rarely mean one thing. After a few months you can order a meal. After a year you can argue about the bill. After many years you begin to dream in the new language, and you notice that you have become a slightly different person when you speak it.

The forecast for tomorrow is mostly cloudy with a chance of light rain in the afternoon. Temperatures will reach a high of 14 degrees in the south and 9 degrees in the north, with a moderate wind from the west. On Saturday the clouds will clear and the weekend should be dry and bright, although the nights will be cold, with frost possible in sheltered valleys. Drivers are advised to take care on minor roads early on Sunday morning.

The lighthouse keeper had lived alone on the island for eleven years when the letter arrived. It came on the supply boat, in a blue envelope, between a box of tinned tomatoes and a new pair of gloves. He did not open it at once. He put it on the kitchen table, climbed the stairs to the lamp, cleaned the glass, checked the clockwork, wrote the weather in the log, and only then, when the sun was going down and the beam had begun to turn, did he come back and read it. It was from his sister. She wrote that she was well, that her children were grown, and that she would like, if he agreed, to come and visit in the spring. He read it three times. Then he took a sheet of paper and wrote, very slowly, the first letter he had written in eleven years.

Dear Anna, thank you for your letter, which arrived today with the boat. I am well. The island is the same as ever: windy, wet, and more beautiful than I can describe. The light works perfectly. I have a garden now, behind the wall where the wind cannot reach, and I grow potatoes, onions, and a few stubborn carrots. Please come in April, when the birds return. Bring warm clothes and good boots. I will meet you at the harbour. Your brother, Tomas.

The public library on Station Road will reopen on Monday after six months of repairs. The roof has been replaced, the heating has been modernised, and the children's room has moved to the ground floor, next to a new garden where readers can sit in good weather. The library will also offer free computer classes on Tuesday and Thursday evenings, and a reading group for teenagers on Saturday mornings. "We wanted to make the building warmer, brighter, and easier to use," said the head librarian. "But the most important thing has not changed. Anyone can walk in, sit down, and read, and nobody will ask them why."

Stars are born in clouds of gas and dust that drift between older stars. When part of a cloud becomes dense enough, gravity pulls it together faster than pressure can push it apart. The collapsing clump heats up as it shrinks, and after hundreds of thousands of years the centre becomes hot enough for hydrogen to fuse into helium. At that moment a star begins to shine by its own light. The leftover material often forms a flat, spinning disk, and in that disk dust grains stick together, grow into pebbles and rocks, and sometimes, over millions of years, into planets.

Plants make their food from light. In the green parts of a leaf, tiny structures called chloroplasts capture energy from sunlight and use it to split water and combine carbon dioxide from the air into sugar. Oxygen is released as a by-product, which is lucky for us. The sugar is used to build the plant's body and to power its growth. When we eat a plant, or an animal that ate a plant, we are using energy that started its journey in the sun about eight minutes before it reached the leaf.

A compiler is a program that translates source code, written by people, into machine code that a processor can run. It usually works in stages. First it reads the text and breaks it into tokens: names, numbers, operators and punctuation. Then it checks that the tokens form a valid program and builds a tree that represents the structure of the code. Later stages analyse the tree, find errors, and transform it into a simpler internal form. Finally the compiler chooses instructions, assigns values to registers, and writes the result to a file. Good compilers also optimise: they remove work that is never needed, move work out of loops, and arrange memory accesses so that the processor spends less time waiting.

Memory in a modern computer is a hierarchy. Registers are tiny and instant. The level one cache holds a few tens of kilobytes and answers in a few cycles. The level two and level three caches are larger and slower. Main memory holds gigabytes but takes a hundred cycles or more to respond, and a disk or network is slower still by orders of magnitude. Fast programs are usually the ones that respect this hierarchy: they touch memory in order, reuse data while it is still in cache, and avoid jumping around at random.

A mixture of experts model replaces one large feed-forward layer with many smaller ones, called experts, and a small router that chooses, for every token, which few experts to use. Because only a handful of experts run for each token, the model can hold far more parameters than it spends on any single step. The price is memory: all the experts must be stored somewhere, even though most of them are idle at any moment. Systems that run such models on modest hardware often keep the popular experts on the graphics card and the rest in the main memory of the computer, and they move work between the two as the router decides.

Some experts are much more popular than others. In a trained model, a small group of experts may receive a third of all tokens in a layer, while many others are chosen only rarely. This is useful to know when deciding where to place them: the busiest experts deserve the fastest memory. It also means that measurements made with perfectly uniform routing can be misleading, because real traffic is uneven and changes with the kind of text being processed.

My grandmother kept a notebook of recipes in a drawer in the kitchen. The cover was green and the pages were soft from use. Some recipes were written in pencil, some in ink, and some had notes added years later in a different colour: "less sugar", "better with apples", "Peter likes this". There were no photographs and very few exact quantities. A cup meant her blue cup. A hot oven meant the oven was hot. When I try to cook from it today, I understand that the notebook was never meant to replace her; it was meant to remind her.

On the train to the coast a man across the aisle was doing a crossword with great concentration. Every few minutes he sighed, tapped his pen on the newspaper, and looked out of the window as if the answer might be written on a passing barn. Near the end of the journey he turned to me and asked if I knew a word of seven letters meaning "a place of safety". I said harbour. He counted on his fingers, smiled, and wrote it in. When the train stopped he folded the paper carefully and wished me a good day, and I felt, for no good reason, that I had done something useful.

The meeting was scheduled for ten o'clock, but by ten fifteen only four people had arrived. Someone suggested starting anyway. Someone else said it would be better to wait for the project manager, who had the numbers. They waited. At ten thirty the project manager sent a message saying that she was stuck in traffic and that they should begin without her. The first item on the agenda was "how to make meetings more efficient". Nobody laughed, but several people looked at the ceiling.

It's easy to forget that a good tool should disappear while you use it. A pen that skips, a chair that wobbles, or a program that freezes pulls your attention away from the work and toward the tool. When everything works, you don't notice the tool at all. You notice the sentence you're writing, the board you're cutting, or the problem you're solving. That's why the best tools are often the plainest ones. They don't ask to be admired; they just let you get on with it.

We've all had days when nothing seems to go right. The alarm doesn't ring, the bus is late, the coffee spills, and the one email you needed hasn't arrived. On such days it helps to remember that most problems are small, that they'll look smaller tomorrow, and that you're allowed to stop, breathe, and start again. I'd rather finish a day slowly than not finish it at all, and I've learned that the world is usually more patient than I expect.
)TXT";

constexpr const char* kDialogue = R"TXT(User: Can you explain what a hash table is?
Assistant: A hash table stores pairs of keys and values. It uses a hash function to turn each key into a number, and that number decides which slot of an array the pair goes into. Looking up a key means computing its hash and checking that slot, so on average it takes constant time. When two keys land in the same slot, the table either chains them in a small list or probes for another free slot.

User: What is the difference between a process and a thread?
Assistant: A process is a running program with its own memory space. A thread is a path of execution inside a process. Threads of the same process share memory, which makes communication between them cheap but also means they must coordinate carefully, for example with locks, to avoid corrupting shared data.

User: Give me three tips for writing clear emails.
Assistant: 1. Put the main point or request in the first two sentences.
2. Keep paragraphs short and use a list when you have several items.
3. Write a subject line that says what the email is about and whether action is needed.

User: How many minutes are there in a week?
Assistant: There are 60 minutes in an hour, 24 hours in a day and 7 days in a week, so 60 x 24 x 7 = 10,080 minutes.

User: Translate "good morning" into French, Spanish and German.
Assistant: French: "bonjour". Spanish: "buenos días". German: "guten Morgen".

User: I keep getting a segmentation fault in my C program. Where should I start?
Assistant: Compile with debug information and address sanitizer (for example `gcc -g -fsanitize=address`), then run the program again. The sanitizer usually prints the exact line where memory was read or written out of bounds, or used after it was freed. Common causes are indexing past the end of an array, dereferencing a null pointer, and returning a pointer to a local variable.

User: Why is the sky blue?
Assistant: Sunlight contains all colours. When it passes through the air, the short blue wavelengths are scattered by gas molecules much more than the long red ones. That scattered blue light reaches our eyes from every direction of the sky, so the sky looks blue. At sunset the light travels through more air, most of the blue is scattered away before it reaches us, and the remaining light looks orange and red.

User: Summarise the plot of a story about a lost dog in two sentences.
Assistant: A small dog slips its lead during a storm and spends three days finding its way across the city, helped by a baker, a bus driver and a girl who shares her sandwich. It finally arrives at its own front door just as its family is putting up the last of their posters.

User: What's a good name for a cat?
Assistant: Some ideas: Pepper, Miso, Olive, Biscuit, Juniper, Moth, or Captain. If the cat is very serious, try Professor.

User: Is it better to study in the morning or at night?
Assistant: It depends on the person. Many people concentrate best in the morning, when they are rested, but some find the quiet of the evening easier. What matters more is regular sleep, short breaks, and testing yourself instead of only rereading your notes.

<think>
The user wants a short answer. I should check the arithmetic first: 17 times 23 is 17 times 20 plus 17 times 3, which is 340 plus 51, so 391.
</think>
17 x 23 = 391.

<tool_call>
{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}
</tool_call>
<tool_response>
{"city": "Lisbon", "temperature": 21, "condition": "sunny", "humidity": 0.48}
</tool_response>
It is currently 21 degrees and sunny in Lisbon, with moderate humidity.
)TXT";

constexpr const char* kCode = R"TXT(#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace util {

// Returns the indices of the k largest values, largest first.
std::vector<int> top_k(const std::vector<float>& values, int k) {
  std::vector<int> order(values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  k = std::min<int>(k, static_cast<int>(order.size()));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return values[a] > values[b]; });
  order.resize(k);
  return order;
}

struct Buffer {
  std::vector<uint8_t> data;
  size_t size() const { return data.size(); }
  bool empty() const { return data.empty(); }
};

class Counter {
 public:
  explicit Counter(int start = 0) : value_(start) {}
  int next() { return value_++; }
  void reset() { value_ = 0; }

 private:
  int value_;
};

}  // namespace util

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 1;
  }
  const std::string path = argv[1];
  std::vector<float> scores = {0.5f, 2.0f, -1.0f, 3.5f, 1.25f};
  for (int i : util::top_k(scores, 3)) std::printf("%d: %.2f\n", i, scores[i]);
  return 0;
}

def read_lines(path, skip_empty=True):
    """Return the lines of a text file, without trailing newlines."""
    with open(path, "r", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    if skip_empty:
        lines = [line for line in lines if line.strip()]
    return lines


class Matrix:
    def __init__(self, rows, cols, fill=0.0):
        self.rows = rows
        self.cols = cols
        self.data = [[fill] * cols for _ in range(rows)]

    def __matmul__(self, other):
        if self.cols != other.rows:
            raise ValueError(f"shape mismatch: {self.rows}x{self.cols} @ {other.rows}x{other.cols}")
        out = Matrix(self.rows, other.cols)
        for i in range(self.rows):
            for j in range(other.cols):
                out.data[i][j] = sum(self.data[i][k] * other.data[k][j] for k in range(self.cols))
        return out


def softmax(xs):
    m = max(xs)
    exps = [math.exp(x - m) for x in xs]
    total = sum(exps)
    return [e / total for e in exps]


if __name__ == "__main__":
    import math
    import sys
    for name in sys.argv[1:]:
        print(name, len(read_lines(name)))

{
  "name": "tandem-demo",
  "version": "0.1.0",
  "model": {"hidden_size": 128, "num_layers": 4, "experts": 16, "top_k": 4},
  "tags": ["moe", "inference", "cpu", "gpu"],
  "enabled": true,
  "threshold": 0.75,
  "owner": null
}

$ mkdir -p build && cd build
$ cmake -S .. -B . -G Ninja -DCMAKE_BUILD_TYPE=Release
$ cmake --build . -j 8
$ ./tandem info --model ../models/tiny
$ ls -la | grep safetensors | wc -l
$ git status && git diff --stat

SELECT name, COUNT(*) AS orders, SUM(total) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.id
WHERE o.created_at >= '2024-01-01'
GROUP BY name
ORDER BY revenue DESC
LIMIT 10;

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

const items = [1, 2, 3, 4, 5].map((x) => x * x).filter((x) => x % 2 === 1);
console.log(`odd squares: ${items.join(", ")}`);

fn main() {
    let words = vec!["alpha", "beta", "gamma"];
    for (i, w) in words.iter().enumerate() {
        println!("{}: {}", i, w.to_uppercase());
    }
}

<!DOCTYPE html>
<html lang="en">
  <head><meta charset="utf-8"><title>Status</title></head>
  <body>
    <h1>All systems normal</h1>
    <p class="note">Last update: <time datetime="2025-06-01T12:00:00Z">June 1</time></p>
  </body>
</html>

| layer | experts | tokens | share |
|------:|--------:|-------:|------:|
| 0     | 256     | 4096   | 27.5% |
| 1     | 256     | 4096   | 28.1% |

- [x] write the tokenizer
- [ ] measure throughput
- [ ] update the README
)TXT";

constexpr const char* kNumbers = R"TXT(Invoice 2024-0917. Date: 14 March 2024. Due: 13 April 2024.
Item 1: 3 x desk lamp at 24.99 = 74.97
Item 2: 12 x notebook at 2.50 = 30.00
Item 3: 1 x office chair at 189.00 = 189.00
Subtotal: 293.97; tax (20%): 58.79; total: 352.76 EUR.
The flight leaves at 07:45 and lands at 11:20 local time; the distance is 1,482 km.
Water boils at 100 °C (212 °F) at sea level. The speed of light is about 299,792 km/s.
Population in 1950: 2.5 billion; in 2000: 6.1 billion; in 2024: about 8.1 billion.
Call +44 20 7946 0958 or write to help@example.org before 5 p.m. on weekdays.
Version 3.11.4 fixed 27 bugs; version 3.12.0 added 9 features and removed 2 deprecated APIs.
)TXT";

constexpr const char* kOtherScripts = R"TXT(Der Zug nach Hamburg hat heute zwanzig Minuten Verspätung. Die Fahrgäste warten auf dem Bahnsteig, trinken Kaffee und schauen immer wieder auf die große Uhr. Ein kleines Mädchen fragt ihre Mutter, warum Züge überhaupt zu spät kommen können, und die Mutter antwortet, dass auch Züge manchmal einen schlechten Tag haben.

Le marché du samedi commence très tôt. Les marchands installent leurs tables sous les platanes, et bientôt la place sent le pain chaud, les fraises et le café. On y trouve des fromages de la région, des légumes du jardin, du miel, et un vieux monsieur qui répare les parapluies. À midi, tout le monde se retrouve au café pour parler du temps qu'il fait.

En el pueblo de mi abuela, las tardes de verano eran largas y tranquilas. Después de comer, todos dormían la siesta, y las calles quedaban vacías bajo el sol. Cuando por fin bajaba el calor, los vecinos sacaban sus sillas a la puerta y hablaban hasta muy tarde, mientras los niños jugaban al fútbol en la plaza.

La cucina italiana è semplice e generosa. Pochi ingredienti, ma buoni: pomodori maturi, olio d'oliva, basilico fresco, un po' di sale. Mia zia diceva sempre che la pasta non aspetta nessuno, e che a tavola non si invecchia mai.

A cidade acorda devagar. Os primeiros elétricos sobem a colina, as padarias abrem as portas e o cheiro a pão quente espalha-se pelas ruas estreitas. Ao longe, o rio brilha ao sol da manhã.

Vandaag regent het weer, maar de fietsers laten zich niet tegenhouden. Met een regenjas en een goede bel kom je overal.

Zimą jezioro zamarza, a dzieci jeżdżą na łyżwach od rana do wieczora. Dziadek mówi, że kiedyś lód był grubszy, ale nikt mu nie wierzy.

Vinteren er lang, men lyset i mars er fantastisk. Da går alle ut på ski, og termosen med kakao er det viktigste i sekken.

Москва встретила нас снегом и ярким солнцем. Мы долго гуляли по набережной, пили горячий чай в маленьком кафе и говорили о книгах, которые хотели прочитать. Вечером город зажёг огни, и река стала похожа на длинную золотую ленту.

Учиться никогда не поздно. Главное — начать, а потом не останавливаться, даже если сначала всё кажется трудным.

Η θάλασσα ήταν ήρεμη και το νερό τόσο καθαρό που έβλεπες τα βότσαλα στον βυθό. Καθίσαμε στην ακτή μέχρι να δύσει ο ήλιος και μιλήσαμε για το καλοκαίρι που πέρασε.

今天天气很好，我们去公园散步。湖边有很多人在钓鱼，孩子们在草地上放风筝。中午我们在一家小饭馆吃了饺子和面条，味道非常好。学习一门新的语言需要时间和耐心，但是每天进步一点点，就会越来越好。

東京の朝はとても早い。駅には通勤する人がたくさんいて、電車は時間どおりに来ます。私は毎朝コーヒーを飲んでから会社に行きます。週末には友達と一緒に山に登ったり、温泉に入ったりするのが好きです。ひらがなとカタカナを覚えたら、漢字の勉強を始めましょう。

서울의 가을은 정말 아름답습니다. 나뭇잎이 노랗고 빨갛게 물들고, 하늘은 높고 맑습니다. 주말에는 친구들과 함께 산에 가서 김밥을 먹고 사진을 찍습니다. 한국어를 배우는 것은 어렵지만 재미있습니다.

ذهبنا إلى السوق في الصباح الباكر. كانت الشوارع مزدحمة بالناس، ورائحة الخبز الطازج والقهوة تملأ المكان. اشترينا الفواكه والخضروات ثم جلسنا في مقهى صغير نتحدث عن خطط الأسبوع.

הבוקר ירד גשם קל, ואחר כך יצאה השמש. הלכנו לשוק וקנינו פירות, לחם טרי וגבינה.

आज मौसम बहुत अच्छा है। हम सुबह जल्दी उठे और पार्क में टहलने गए। बच्चे खेल रहे थे और पेड़ों पर चिड़ियाँ गा रही थीं। नई भाषा सीखने में समय लगता है, लेकिन हर दिन थोड़ा अभ्यास करने से सब आसान हो जाता है।

วันนี้อากาศดีมาก เราไปเดินเล่นที่สวนสาธารณะและกินข้าวเหนียวมะม่วงที่ร้านเล็ก ๆ ใกล้บ้าน

Hôm nay trời đẹp, chúng tôi đi dạo quanh hồ và uống cà phê sữa đá. Học một ngôn ngữ mới cần kiên nhẫn, nhưng mỗi ngày một chút thì sẽ tiến bộ.

Bugün hava çok güzel. Sabah erkenden kalktık, sahilde yürüyüş yaptık ve simit ile çay içtik.

Emoji and symbols: ☀️ 🌧️ ❄️ 🚲 🍞 📚 ✅ ❌ → ← ↑ ↓ ± × ÷ ≤ ≥ ≠ ∞ € £ ¥ © ® ™ § ¶ • … “quoted” ‘single’ — dash – range.
)TXT";

constexpr const char* kMoreProse = R"TXT(The workshop at the end of the garden smells of sawdust, oil and old coffee. There is a long bench under the window, a rack of chisels sorted by width, and a radio that only receives one station. My father built most of the furniture in our house there, slowly, one evening at a time. He used to say that a table is finished when you stop wanting to change it, and that this usually happens about a week after you have started using it. When I was small he let me hold the other end of the boards and sweep the floor, and later he taught me to sharpen a plane iron until it could shave a thin, curling ribbon from the edge of a pine board.

The first rule of the workshop was to put every tool back where it belonged. The second rule was to measure twice and cut once. The third rule, which he added after an accident with a drill, was never to work when you are tired or in a hurry. I have broken all three rules many times, and every time I have regretted it. Good habits are boring to describe and wonderful to have.

Cities are always being rebuilt. A street that looks permanent is really a slow conversation between the people who live there and the people who lived there before. A bakery becomes a bank, then a bookshop, then a bakery again. A warehouse becomes a block of flats. A railway line becomes a park where people walk their dogs on the old embankment and children climb on the iron bridge. Walking through a city with someone who has lived there for fifty years is like reading a book with notes in the margin: every corner has a second story underneath the first.

In the small hours of the night the hospital is quiet but not asleep. Nurses move between the rooms with soft shoes, checking monitors, adjusting pillows, writing numbers on charts. A machine beeps in one room and a patient coughs in another. In the staff kitchen someone has left a box of biscuits with a note: "Thank you for looking after my mother." The night shift reads it several times before morning.

Good documentation answers three questions: what is this, why would I use it, and how do I start. Everything else can come later. Many projects fail the first test because the people who wrote them know the answer so well that they forget to write it down. A short paragraph at the top of a file, one working example, and a list of the common mistakes will save more time than a hundred pages of reference that nobody reads.

When you debug a program, change one thing at a time. Write down what you expected to happen and what actually happened. Make the failing case as small as you can. Check your assumptions, especially the ones you are sure about. Read the error message carefully, all of it, including the part that looks like noise. Most bugs are not mysterious; they are simply hidden behind something that we did not think to look at.

Testing is a way of asking questions. A unit test asks whether a small piece of code does what it promises. An integration test asks whether the pieces work together. A benchmark asks how fast, and a fuzz test asks what happens when the input is strange, broken or hostile. None of them proves that a program is correct, but together they make it much harder for a mistake to hide, and they tell you quickly when a change breaks something that used to work.

The village holds a market every Thursday in the square in front of the town hall. Farmers come with eggs, cheese, apples, potatoes and honey. A man from the coast sells fish from the back of a small white van. There is a stall with second-hand books, another with knitted hats and scarves, and a woman who sharpens knives while you wait. By noon the square is crowded and noisy, and by three o'clock it is empty again, except for the pigeons and a few cabbage leaves.

Rain began in the afternoon and did not stop for three days. The river rose, the fields turned into shallow lakes, and the roads to the north were closed. People helped each other: a farmer with a tractor pulled cars out of the flooded lane, the school opened its hall for families who had to leave their homes, and the baker gave away bread to anyone who asked. When the water finally went down, it left mud everywhere, and everyone started cleaning together.

The history of writing is also a history of materials. People wrote on clay, stone, bark, bamboo, papyrus, parchment and paper, and each material shaped what could be written and how long it would last. Clay tablets survived fires that destroyed whole libraries of softer material. Paper was cheap and light, so books could travel. Today we write on screens, and our words are stored as patterns of electric charge that nobody can read without a machine. It is worth wondering which of our texts will still be readable in a thousand years.

A simple experiment: fill two glasses with water, put one in the sun and one in the shade, and measure the temperature every hour. Write the results in a table. Draw a graph with time on the horizontal axis and temperature on the vertical axis. What do you notice? Which glass warms faster, and why? What would happen if you covered one glass with black paper, or used salt water instead of fresh water? Good experiments are small, careful and honest about what they do not show.

Travel teaches patience. Trains are delayed, buses are full, museums are closed on the one day you are free, and it rains at the beach. But there are also the unexpected gifts: a conversation with a stranger at a bus stop, a meal in a tiny restaurant with no menu, a view from a hill that you climbed only because you were lost. The best journeys are often the ones that did not go according to plan.

It was the kind of morning when everything seems possible. The air was cool and clear, the birds were loud, and the street was still empty. She made a cup of tea, opened the window, and sat down at the desk with a blank sheet of paper. For a long time she did not write anything. Then she wrote a single sentence, crossed it out, wrote it again, and smiled. By lunchtime she had three pages, and by evening the story had a name.

Numbers are everywhere once you start looking. A recipe for four people needs to be scaled for six. A train leaves at 9:42 and arrives at 11:07, so the journey takes one hour and twenty-five minutes. A jacket costs 80 pounds and is reduced by 25 percent, so it now costs 60. A garden is 12 metres long and 7 metres wide, so it has an area of 84 square metres. Mathematics is not only in textbooks; it is in every shop, kitchen and timetable.
)TXT";

constexpr const char* kMoreCode = R"TXT(// A fixed-size ring buffer: push overwrites the oldest element when full.
template <typename T, size_t N>
class RingBuffer {
 public:
  void push(const T& value) {
    data_[head_] = value;
    head_ = (head_ + 1) % N;
    if (size_ < N) ++size_;
  }
  size_t size() const { return size_; }
  const T& operator[](size_t i) const { return data_[(head_ + N - size_ + i) % N]; }

 private:
  std::array<T, N> data_{};
  size_t head_ = 0;
  size_t size_ = 0;
};

Status load_config(const std::string& path, Config* out) {
  std::ifstream in(path);
  if (!in) return Status::error("cannot open " + path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    return Status::error(path + ": " + e.what());
  }
  out->hidden_size = j.value("hidden_size", 0);
  out->num_layers = j.value("num_hidden_layers", 0);
  if (out->hidden_size <= 0) return Status::error(path + ": hidden_size must be positive");
  return Status::ok();
}

for (int64_t t = 0; t < tokens; ++t) {
  const float* x = input + t * hidden;
  float* y = output + t * hidden;
  float sum = 0.0f;
  for (int64_t i = 0; i < hidden; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / hidden + eps);
  for (int64_t i = 0; i < hidden; ++i) y[i] = x[i] * scale * (1.0f + weight[i]);
}

import json
import os
from dataclasses import dataclass, field


@dataclass
class Settings:
    model: str
    threads: int = 4
    temperature: float = 0.7
    stop: list = field(default_factory=lambda: ["<|im_end|>"])

    @classmethod
    def from_file(cls, path):
        with open(path) as f:
            data = json.load(f)
        return cls(**data)


def batched(items, size):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def main():
    settings = Settings.from_file(os.environ.get("SETTINGS", "settings.json"))
    for i, batch in enumerate(batched(range(10), 3)):
        print(f"batch {i}: {batch} (threads={settings.threads})")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
set -euo pipefail
for f in "$@"; do
  if [ ! -f "$f" ]; then
    echo "missing: $f" >&2
    exit 1
  fi
  echo "$(wc -l < "$f") lines in $f"
done

CREATE TABLE users (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  email TEXT UNIQUE,
  created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);
INSERT INTO users (name, email) VALUES ('Ada', 'ada@example.org'), ('Linus', 'linus@example.org');
UPDATE users SET email = NULL WHERE id = 2;
)TXT";

constexpr const char* kStory = R"TXT(Once upon a time, in a country of hills and small rivers, there lived a clockmaker who could not sleep. Every night, when the town was dark, he sat in his shop and listened to the clocks. There were tall clocks and small clocks, clocks with birds and clocks with bells, and each one had its own voice. He knew them all. If one of them was two seconds slow, he heard it, and in the morning he opened it and fixed it before the owner came to collect it.

One winter evening a girl knocked on the door. She was carrying a clock wrapped in a scarf. "It stopped," she said, "on the night my grandfather died, and nobody can make it go again." The clockmaker unwrapped it carefully. It was an old travelling clock with a brass case and a white face, and on the back someone had engraved a small ship. He opened it, looked inside for a long time, and found nothing broken at all.

"Leave it with me for a week," he said. Every night that week he sat with the silent clock and listened, and every night he heard nothing. On the seventh night, very late, he noticed that the little ship on the back was not a decoration but a lever. He pressed it gently. Something clicked, the hands trembled, and the clock began to tick, softly at first and then steadily, as if it had only been waiting for someone to ask.

When the girl came back, he gave her the clock and showed her the ship. "Your grandfather must have stopped it himself," he said, "so that it would keep the time he left." The girl held the clock against her ear for a while. Then she pressed the ship again, and the ticking stopped. "I think I will keep it like this for now," she said, "and start it again when I am ready." The clockmaker nodded. That night, for the first time in many years, he slept until morning.

Frequently asked questions

How do I reset my password? Open the settings page, choose "Account", and click "Reset password". We will send a link to your email address. The link is valid for 24 hours.

Can I change my username? Yes. Usernames can be changed once every 30 days. Your old name will be available to other people after two weeks.

Why is my upload so slow? Large files are uploaded in parts. If your connection is unstable, each part may be retried several times. Try a wired connection, close other programs that use the network, or upload the file at a quieter time of day.

Do you offer refunds? If you are not satisfied, contact support within 14 days of your purchase and we will return the full amount, no questions asked.

Where is my data stored? Your files are stored in two data centres in different regions, and every file is copied at least three times. Deleted files can be recovered for 30 days.

How to plant a tree. Choose a place with enough room for the tree to grow, both above and below the ground. Dig a hole twice as wide as the root ball and about as deep. Loosen the soil at the bottom and the sides. Take the tree out of its pot, gently spread the roots, and set it in the hole so that the top of the root ball is level with the ground. Fill the hole with soil, press it down firmly, and water thoroughly. Add a layer of mulch around the base, but keep it away from the trunk. Water once a week during the first summer, more often if the weather is hot and dry.

How to make a good cup of tea. Boil fresh water. Warm the pot with a little of it and pour that away. Put in one spoon of tea per person and one for the pot. Pour on the water as soon as it boils and wait three to five minutes, depending on how strong you like it. Add milk if you want, but never before the tea. Some people will disagree with every one of these rules, and that is part of the pleasure of tea.

Notes from a meeting, Tuesday. Present: Sam, Priya, Jonas, Mei, and Olga. First, the release is moved from Friday to the following Wednesday, because the new installer still fails on older machines. Second, Priya will write the migration guide and Jonas will review it. Third, Mei reported that the crash in the export function is fixed, but the fix needs more tests. Fourth, Olga asked everyone to update their time sheets before the end of the month. Next meeting: Thursday at 14:00 in the small room.
)TXT";

}  // namespace

std::string_view builtin_bpe_corpus() {
  static const std::string text = std::string(kProse) + "\n" + kMoreProse + "\n" + kStory + "\n" + kDialogue + "\n" + kCode + "\n" + kMoreCode + "\n" + kNumbers + "\n" + kOtherScripts;
  return text;
}

}  // namespace tandem
